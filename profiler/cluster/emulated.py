"""`ppd cluster up --emulate HW`: emulated nodes instead of vLLM, same cluster.json and proxy.

All nodes of the layout run in one background process (profiler.emulate.serve), one port each
from --base-port, so a D pulls KV over its P's modelled link. cluster.json lists every node
with that process's pid (`ppd cluster down` stops it once) and an "emulated" record (preset,
link, tokenizer) that tables and reports made on the cluster copy into their metadata. D and R
nodes publish KV cache events where a vLLM node would (`profiler.emulate.node_kv_events`), and
cluster.json names them, so `ppd proxy --cluster ... --policy live` reads residency.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from profiler.cluster import procs
from profiler.cluster.launcher import (
    PROXY_LOG,
    Cluster,
    LaunchedNode,
    Progress,
    plan_free_nodes,
    quiet,
    write_json,
)
from profiler.cluster.plan import ClusterConfig, ClusterError, cluster_document
from profiler.cluster.procs import ManagedProcess, StartupError
from profiler.emulate.label import emulated_backend
from profiler.emulate.presets import PresetError, resolve
from profiler.emulate.tokenizer import tokenizer_dir

HOST_LOG = "emulated-nodes.log"


def start_emulated_cluster(config: ClusterConfig, hardware: str, link: str | None = None,
                           progress: Progress = quiet, max_model_len: int | None = None,
                           num_gpu_blocks: int | None = None) -> Cluster:
    """Start config.layout as emulated nodes of preset hardware:config.model; write cluster.json.

    max_model_len None: the preset's default (config.max_model_len is vLLM-CPU's 4096);
    num_gpu_blocks None: the preset's KV cache size."""
    try:
        preset = resolve(hardware, config.model, link, max_model_len, num_gpu_blocks)
    except PresetError as exc:
        raise ClusterError(str(exc)) from None
    state_dir = config.state_dir.resolve()
    nodes = plan_free_nodes(config)
    tokenizer = tokenizer_dir()
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / PROXY_LOG).unlink(missing_ok=True)
    log = state_dir / HOST_LOG
    log.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "profiler.emulate.serve", "--emulate", preset_argument(hardware),
            "--model", config.model, "--host", config.host, "--tokenizer", str(tokenizer),
            "--link", preset.link.name, "--max-model-len", str(preset.max_model_len),
            "--kv-events"]
    if num_gpu_blocks is not None:
        argv += ["--num-gpu-blocks-override", str(num_gpu_blocks)]
    if config.kv_readback_ttl_s is not None:
        argv += ["--kv-readback-ttl", str(config.kv_readback_ttl_s)]
    for spec in nodes:
        argv += ["--node", f"{spec.role.value}:{spec.port}"]
    first = procs.spawn("emulated-nodes", "", argv, os.environ, log, cwd=state_dir)
    started = [LaunchedNode.running(spec.role,
                            ManagedProcess(spec.name, f"http://{config.host}:{spec.port}",
                                           first.pid, log, first.process))
               for spec in nodes]  # fmt: skip
    progress(f"starting {len(nodes)} emulated node(s) ({preset.name}) in pid {first.pid} "
             f"(log {log})")
    try:
        procs.wait_ready([n.proc for n in started], "/v1/models", config.startup_timeout_s,
                         on_ready=lambda p, s: progress(f"{p.name} ready after {s:.0f} s"))
    except StartupError as exc:
        procs.stop([first])
        raise ClusterError(str(exc)) from None
    except BaseException:
        procs.stop([first])
        raise
    cluster = Cluster(config.model, config.layout, state_dir, started, tokenizer,
                      progress=progress)  # fmt: skip
    doc = cluster_document(config.model, config.layout,
                           [(n.role, n.url, n.proc.pid, n.proc.log) for n in started],
                           kv_readback_ttl_s=config.kv_readback_ttl_s)
    doc["emulated"] = {"preset": preset.name, "link": preset.link.name,
                       "backend": emulated_backend(preset.name), "tokenizer": str(tokenizer),
                       "cost": cost_argument(hardware, config.model)}
    write_json(cluster.cluster_file, doc)
    return cluster


def preset_argument(hardware: str) -> str:
    """--emulate as the nodes' process gets it: a preset file by its absolute path (that
    process runs in the state directory, where a relative path does not lead)."""
    path = Path(hardware)
    return str(path.resolve()) if path.is_file() else hardware


def cost_argument(hardware: str, model: str) -> str | None:
    """The `--cost` that `ppd sim live-costs` and `ppd sim run` take for these nodes' preset
    (None for `linear`, which only the emulator knows)."""
    if hardware == "linear":
        return None
    path = Path(hardware)
    return str(path.resolve()) if path.is_file() else f"{hardware}:{model}"
