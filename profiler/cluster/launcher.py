"""A local vLLM P/D cluster (and optionally the proxy) in the background, described by
DIR/cluster.json for `ppd proxy --cluster` and for `ppd cluster down` (the command line is
`profiler.cluster.cli`).

Python API (tests, profiler, demo)::

    config = ClusterConfig(model="tiny", layout=parse_layout("1P1D"), state_dir=tmp)
    with start_cluster(config) as cluster:
        cluster.url(Role.DECODE); cluster.start_proxy("local", port=18000)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from profiler.cluster import cpu_placement, procs
from profiler.cluster.plan import (
    CLUSTER_FILE,
    DEFAULT_PROXY_PORT,
    DEFAULT_STATE_DIR,
    KV_DIR,
    NIXL_SIDE_CHANNEL_OFFSET,
    ClusterConfig,
    ClusterError,
    Connector,
    Device,
    Layout,
    NodePlan,
    ServedModel,
    cluster_document,
    nixl_side_channel_port,
    node_command,
    node_env,
    node_url,
    parse_layout,
    plan_nodes,
)
from profiler.cluster.procs import ManagedProcess, StartupError
from profiler.cluster.proxy_flags import proxy_arguments
from profiler.cluster.warmup import WarmupError, warm_up, warm_up_transfers
from profiler.models.prepare import (
    ModelName,
    prepare_model,
    serving_dtype,
)
from proxy.shared import vocabulary
from proxy.shared.vocabulary import Role

PROXY_FILE = "proxy.json"
PROXY_LOG = "proxy.log"

Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """A `Progress` that says nothing."""
    pass


@dataclass(frozen=True, slots=True)
class LaunchedNode(vocabulary.Node):
    """A running node: where it answers, its role, and its server process."""

    proc: ManagedProcess

    @classmethod
    def running(cls, role: Role, proc: ManagedProcess) -> LaunchedNode:
        return cls(proc.url, role, proc)


@dataclass(slots=True)
class Cluster:
    """Running servers of one state directory; stops them on `stop()` or leaving a `with`."""

    model: str
    layout: Layout
    state_dir: Path
    nodes: list[LaunchedNode]
    model_path: Path | None = None
    proxy: ManagedProcess | None = None
    progress: Progress = field(default=quiet, repr=False)

    @property
    def cluster_file(self) -> Path:
        return self.state_dir / CLUSTER_FILE

    def urls(self, role: Role) -> list[str]:
        """URLs of the nodes with `role`, in port order."""
        return [node.url for node in self.nodes if node.role is role]

    def url(self, role: Role, index: int = 0) -> str:
        """URL of the index-th node with `role`."""
        urls = self.urls(role)
        if index >= len(urls):
            raise ClusterError(f"layout {self.layout} has no {role.value} node #{index}")
        return urls[index]

    @property
    def proxy_url(self) -> str:
        if self.proxy is None:
            raise ClusterError("no proxy runs in front of this cluster")
        return self.proxy.url

    def start_proxy(self, policy: str | None = None, port: int = DEFAULT_PROXY_PORT,
                    host: str = "127.0.0.1", extra_args: Sequence[str] = (),
                    timeout_s: float = 60.0) -> str:
        """Start `ppd proxy --cluster FILE` in front (stopping a running one); return its URL."""
        self.stop_proxy()
        if not procs.port_free(host, port):
            raise ClusterError(f"proxy port {port} is in use; choose another --proxy-port")
        argv = [sys.executable, "-m", "profiler.cli", "proxy",
                *proxy_arguments(self.cluster_file, policy, port, host, self.model_path,
                                 extra_args)]
        url = f"http://{host}:{port}"
        log = self.state_dir / PROXY_LOG
        proxy = procs.spawn("proxy", url, argv, os.environ, log)
        self.progress(f"starting proxy on {url} (policy {policy or 'default'}, log {log})")
        try:
            procs.wait_ready([proxy], "/health", timeout_s)
        except BaseException:
            procs.stop([proxy])
            raise
        self.proxy = proxy
        doc = {"url": url, "pid": proxy.pid, "log": str(log), "policy": policy}
        write_json(self.state_dir / PROXY_FILE, doc)
        return url

    def stop_proxy(self) -> None:
        if self.proxy is not None:
            procs.stop([self.proxy])
            self.proxy = None
            (self.state_dir / PROXY_FILE).unlink(missing_ok=True)

    def stop(self) -> None:
        """Stop the proxy and every node, and drop the shared KV directory."""
        self.stop_proxy()
        procs.stop([node.proc for node in self.nodes])
        shutil.rmtree(self.state_dir / KV_DIR, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def resolve_model(spec: str, dtype: str | None = None) -> ServedModel:
    """`tiny`, `smollm2` (prepared if needed) or a model DIR, served under its name.

    dtype None takes the dtype a prepared model's marker asks for (else vLLM's default).
    """
    if spec in {m.value for m in ModelName}:
        name, path = spec, prepare_model(spec)
    else:
        name, path = Path(spec).expanduser().resolve().name, Path(spec).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise ClusterError(
                f"model {spec!r} is neither tiny/smollm2 nor a directory with a config.json"
            )
    return ServedModel(name, path, dtype if dtype is not None else serving_dtype(path))


def default_cores() -> tuple[int, ...]:
    """The CPU ids this process may run on, to pin one node per core."""
    return tuple(sorted(os.sched_getaffinity(0)))


def plan_free_nodes(config: ClusterConfig) -> list[NodePlan]:
    """The nodes of `config`; ClusterError if its state dir's cluster still runs or a port is
    taken (checked before anything starts, for vLLM and emulated clusters alike)."""
    _refuse_running(config.state_dir.resolve())
    nodes = plan_nodes(config)
    busy = [n.port for n in nodes if not procs.port_free(config.host, n.port)]
    if busy:
        raise ClusterError(f"port(s) {busy} in use; stop what holds them or choose --base-port")
    return nodes


def _refuse_busy_side_channels(config: ClusterConfig, nodes: Sequence[NodePlan]) -> None:
    """NIXL's handshake ports must be free too: a taken one fails only at D's first pull."""
    if config.connector is not Connector.NIXL:
        return
    busy = [port for port in (nixl_side_channel_port(config, n) for n in nodes
                              if n.role is not Role.REPLICA)
            if not procs.port_free(config.host, port)]
    if busy:
        raise ClusterError(f"NIXL side-channel port(s) {busy} in use (base port + "
                           f"{NIXL_SIDE_CHANNEL_OFFSET}); choose another --base-port")


def start_cluster(config: ClusterConfig, progress: Progress = quiet) -> Cluster:
    """Start every node of `config`, wait until each answers /v1/models, write cluster.json.

    On failure (a node exits, the timeout passes, Ctrl-C) the nodes already started are
    stopped and a ClusterError carries the tail of the failing node's log.
    """
    state_dir = config.state_dir.resolve()
    nodes = plan_free_nodes(config)
    _refuse_busy_side_channels(config, nodes)
    model = resolve_model(config.model, config.dtype)
    state_dir.mkdir(parents=True, exist_ok=True)
    # KV files are keyed by prompt tokens, not by model: stale ones from another run must go.
    shutil.rmtree(config.kv_dir, ignore_errors=True)
    config.kv_dir.mkdir(parents=True)
    (state_dir / PROXY_LOG).unlink(missing_ok=True)  # logs describe this cluster only
    started: list[LaunchedNode] = []
    try:
        for spec in nodes:
            log = state_dir / f"{spec.name}.log"
            log.unlink(missing_ok=True)
            proc = procs.spawn(
                spec.name, node_url(config, spec),
                node_command(config, model, spec),
                node_env(config, spec, os.environ), log, cwd=state_dir,
            )
            started.append(LaunchedNode.running(spec.role, proc))
            progress(f"starting {spec.name} on {proc.url} (log {log})")
        procs.wait_ready(
            [n.proc for n in started], "/v1/models", config.startup_timeout_s,
            on_ready=lambda p, s: progress(f"{p.name} ready after {s:.0f} s"),
        )
        pinned = [(n.proc, spec.core) for n, spec in zip(started, nodes, strict=True)
                  if spec.core is not None]
        _place(pinned, progress)
        if config.connector is Connector.NIXL:
            if config.device is Device.CPU:
                warm_up([n.proc for n in started if n.role is not Role.REPLICA], model.name)
            warm_up_transfers([n.proc for n in started if n.role is Role.PREFILL],
                              [n.proc for n in started if n.role is Role.DECODE], model.name)
            _place(pinned, quiet)  # threads the first transfers started
    except (StartupError, WarmupError) as exc:
        procs.stop([n.proc for n in started])
        raise ClusterError(str(exc)) from None
    except BaseException:
        procs.stop([n.proc for n in started])
        raise
    cluster = Cluster(model.name, config.layout, state_dir, started, model.path,
                      progress=progress)
    doc = cluster_document(
        model.name, config.layout, [(n.role, n.url, n.proc.pid, n.proc.log) for n in started],
        connector=config.connector,
        kv_readback_ttl_s=(config.kv_readback_ttl_s if config.connector is Connector.NIXL
                           else None),
    )
    write_json(cluster.cluster_file, doc)
    return cluster


def _place(nodes: Sequence[tuple[ManagedProcess, int]], progress: Progress) -> None:
    """Each CPU node back on its own core, NIXL's poll loops at nice 19 (`cpu_placement`)."""
    placements = cpu_placement.place_nodes([(proc.pid, core) for proc, core in nodes])
    for (proc, _), placed in zip(nodes, placements, strict=True):
        if placed.idled:
            progress(f"{proc.name}: {placed.threads} threads on core {placed.core}, "
                     f"{len(placed.idled)} poll loop(s) at nice {cpu_placement.POLLER_NICE}")


def load_cluster(state_dir: Path) -> Cluster:
    """The cluster described by state_dir/cluster.json (and proxy.json), without processes."""
    state_dir = state_dir.resolve()
    path = state_dir / CLUSTER_FILE
    try:
        doc = json.loads(path.read_text())
        nodes: list[LaunchedNode] = []
        for n in doc["nodes"]:
            role = Role(n["role"])
            name = f"{role.value}-{sum(1 for m in nodes if m.role is role)}"
            nodes.append(LaunchedNode.running(
                role, ManagedProcess(name, n["url"], int(n["pid"]), Path(n["log"]))))
        cluster = Cluster(doc["model"], parse_layout(doc["layout"]), state_dir, nodes)
    except FileNotFoundError:
        raise ClusterError(f"no cluster in {state_dir} ({CLUSTER_FILE} not found)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ClusterError(f"{path} is not a valid cluster file: {exc}") from None
    proxy_path = state_dir / PROXY_FILE
    if proxy_path.is_file():
        p = json.loads(proxy_path.read_text())
        cluster.proxy = ManagedProcess("proxy", p["url"], int(p["pid"]), Path(p["log"]))
    return cluster


def stop_cluster(state_dir: Path = DEFAULT_STATE_DIR) -> Cluster:
    """Stop the proxy and nodes recorded in state_dir (from any process); return what it was."""
    cluster = load_cluster(state_dir)
    cluster.stop()
    cluster.cluster_file.unlink(missing_ok=True)
    return cluster


@dataclass(frozen=True, slots=True)
class NodeHealth:
    name: str
    role: str
    url: str
    pid: int
    running: bool
    healthy: bool  # answers GET /v1/models (nodes) or /health (proxy) with 200


def cluster_status(state_dir: Path = DEFAULT_STATE_DIR) -> list[NodeHealth]:
    """Each recorded server's process state and health."""
    cluster = load_cluster(state_dir)
    checks = [(n.proc, n.role.value, "/v1/models") for n in cluster.nodes]
    if cluster.proxy is not None:
        checks.append((cluster.proxy, "proxy", "/health"))
    with httpx.Client(timeout=2.0) as client:
        return [
            NodeHealth(p.name, role, p.url, p.pid, procs.group_alive(p.pid),
                       procs.answers(client, p.url + path))
            for p, role, path in checks
        ]


def _refuse_running(state_dir: Path) -> None:
    if not (state_dir / CLUSTER_FILE).is_file():
        return
    try:
        old = load_cluster(state_dir)
    except ClusterError:
        return  # unreadable leftovers are overwritten
    if any(procs.is_group_leader(n.proc.pid) for n in old.nodes):
        raise ClusterError(
            f"a cluster from {state_dir} is still running; `ppd cluster down --state {state_dir}`"
        )


def write_json(path: Path, doc: object) -> None:
    """Write doc as JSON atomically (a temporary file renamed over path)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)  # readers (the proxy) never see half a file
