"""`ppd cluster up|status|down`: a local vLLM P/D cluster (and optionally the proxy) in the
background, described by DIR/cluster.json for `ppd proxy --cluster` and for `down`."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from profiler.cli import HelpFormatter
from profiler.cluster import shape_probe
from profiler.cluster.plan import (
    CLUSTER_FILE,
    DEFAULT_BASE_PORT,
    DEFAULT_KV_READBACK_TTL_S,
    DEFAULT_PROXY_PORT,
    DEFAULT_STATE_DIR,
    ClusterConfig,
    ClusterError,
    Connector,
    Device,
    Layout,
    parse_layout,
)
from profiler.models.prepare import ModelName, default_model_dir, is_ready
from proxy.shared.vocabulary import Role

# The launcher (httpx, the emulator's engine) is imported by the actions that start or stop
# something, after the flags are parsed: a usage error or --help returns at once.


def build_parser() -> argparse.ArgumentParser:
    examples = {
        "up": "examples:\n  ppd cluster up --model tiny --layout 1P1D --with-proxy --policy pd\n"
              "  ppd cluster up --emulate h100 --model llama-3.1-8b --layout 1P3D --with-proxy\n"
              "  ppd cluster up --emulate h100 --model llama-3.1-8b --layout 1P3D --with-proxy "
              "--policy ppd --proxy-args '--table tables/h100-llama-3.1-8b-1p3d.csv'",
        "status": "example:\n  ppd cluster status",
        "down": "example:\n  ppd cluster down",
        "probe": "example:\n  ppd cluster probe --out runs/probe   # then ppd sim calibrate "
                 "--probe runs/probe/probe.csv",
    }
    parser = argparse.ArgumentParser(prog="ppd cluster", description=__doc__.split("\n\n")[0],
                                     epilog="\n".join(examples.values()),
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start the nodes (and the proxy) in the background",
                        description="Start vLLM nodes (and optionally `ppd proxy`) in the "
                        "background; `ppd cluster down` stops them.", epilog=examples["up"],
                        formatter_class=HelpFormatter)
    up.add_argument("--model", required=True,
                    help="tiny, smollm2 or a model directory (with --emulate: llama-3.1-8b, tiny)")
    up.add_argument("--layout", required=True, type=_layout_arg,
                    help="nodes to start: NpMd (prefill + decode, e.g. 1P1D, 1P2D), NR "
                    "(replicas) or both (e.g. 1R1P2D: replicas beside P/D, for --policy live)")
    up.add_argument("--device", type=Device, choices=list(Device), default=Device.CPU,
                    help="where vLLM runs")
    up.add_argument("--connector", type=Connector, choices=list(Connector),
                    default=Connector.NIXL,
                    help="KV transfer P->D: nixl (vLLM's NixlConnector over UCX, host buffers "
                    "on cpu) or shared-storage (ExampleConnector: P writes files D reads back)")
    up.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                    help="port of the first node; the next nodes count up from it")
    up.add_argument("--host", default="127.0.0.1", help="address the nodes listen on")
    up.add_argument("--max-model-len", type=int, default=None,
                    help="vLLM --max-model-len (context limit in tokens; default 4096, with "
                    "--emulate 32768)")
    up.add_argument("--dtype", default=None,
                    help="vLLM --dtype (default: what the model asks for, else vLLM's auto)")
    up.add_argument("--kv-cache-gib", type=int, default=1, help="CPU KV cache per node (GiB)")
    up.add_argument("--startup-timeout", type=float, default=300.0, metavar="S",
                    help="seconds to wait for every node's /health")
    up.add_argument("--vllm-args", default="", help="extra vLLM flags, one quoted string")
    up.add_argument("--emulate", default=None, metavar="HW",
                    help="emulated nodes timed by an engine model (h100, linear, ...) "
                    "instead of vLLM; see docs/emulated-nodes.md")
    up.add_argument("--link", default=None,
                    help="with --emulate: P->D link preset (nvlink, rdma-400g, tcp-25g) or "
                    "LATENCY_MS:GBPS")
    up.add_argument("--num-gpu-blocks-override", type=int, default=None, metavar="N",
                    help="with --emulate: KV cache blocks per node instead of the preset's "
                    "(vLLM's flag; for vLLM nodes pass it in --vllm-args)")
    up.add_argument("--no-kv-readback", action="store_true",
                    help="NIXL: do not keep a finished turn's KV on D for P to read back "
                    "(vLLM's bidirectional_kv_xfer, on by default; docs/readback.md)")
    up.add_argument("--kv-readback-ttl", type=int, default=DEFAULT_KV_READBACK_TTL_S,
                    metavar="S", help="NIXL: seconds D keeps a finished turn's KV for a "
                    "readback (vLLM's decoder_kv_blocks_ttl)")
    up.add_argument("--with-proxy", action="store_true", help="start `ppd proxy` in front")
    up.add_argument("--policy", default=None, type=_policy_arg,
                    help="proxy policy with --with-proxy (default: the proxy's, pd); `live` "
                    "gets this cluster's step-cost file unless --proxy-args names one")
    up.add_argument("--proxy-port", type=int, default=DEFAULT_PROXY_PORT,
                    help="port of the proxy (with --with-proxy)")
    up.add_argument("--proxy-args", default="",
                    help="more `ppd proxy` flags with --with-proxy, one shell-quoted string "
                    "(e.g. \"--table tables/h100-llama-3.1-8b-1p3d.csv --w-tpot 3\")")
    for name, help_ in (("status", "show each node's health"), ("down", "stop everything")):
        cmd = sub.add_parser(name, help=help_, description=help_, epilog=examples[name],
                             formatter_class=HelpFormatter)
        cmd.add_argument("--state", type=Path, default=DEFAULT_STATE_DIR,
                         help="the cluster's state directory (cluster.json, logs)")
    up.add_argument("--state", type=Path, default=DEFAULT_STATE_DIR,
                    help="state directory: cluster.json, pids and logs go here")
    probe = sub.add_parser("probe", help="time a node's prefill step by shape (for `ppd sim "
                           "calibrate --probe`)", description=shape_probe.__doc__,
                           epilog=examples["probe"], formatter_class=HelpFormatter)
    probe.add_argument("--out", type=Path, required=True, help="directory for probe.csv")
    probe.add_argument("--state", type=Path, default=DEFAULT_STATE_DIR,
                       help="the cluster's state directory (cluster.json)")
    probe.add_argument("--node", default=None, metavar="URL",
                       help="the node to probe (default: the cluster's first P, else replica)")
    probe.add_argument("--lengths", default=",".join(map(str, shape_probe.DEFAULT_LENGTHS)),
                       help="prompt lengths, comma-separated")
    probe.add_argument("--append", type=int, default=shape_probe.DEFAULT_APPEND,
                       help="tokens appended after a cached prompt")
    probe.add_argument("--repeats", type=int, default=shape_probe.DEFAULT_REPEATS,
                       help="times each shape is sent")
    probe.add_argument("--admin-key", default=None, metavar="K",
                       help="the proxy's --admin-key: the front-end prompts go through the "
                       "cluster's proxy forced onto a D, which needs it when the proxy has one")
    probe.add_argument("--busy", default=",".join(map(str, shape_probe.DEFAULT_BUSY)),
                       metavar="N,N", help="requests kept decoding on the cluster's D while "
                       "busy-text prompts are timed there, one level after another "
                       "(\"\" leaves busy-text out)")
    probe.add_argument("--max-model-len", type=int, default=4096,
                       help="the node's --max-model-len (longer shapes are left out)")
    return parser


def _policy_arg(text: str) -> str:
    from proxy.config.config_files import ConfigError
    from proxy.config.policy_config import parse_policy_name

    try:
        return parse_policy_name(text).value
    except ConfigError as exc:  # argparse reports it as a usage error
        raise argparse.ArgumentTypeError(str(exc)) from None


def _layout_arg(text: str) -> Layout:
    try:
        return parse_layout(text)
    except ClusterError as exc:  # argparse reports it as a usage error
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str]) -> int:
    """`ppd cluster up|status|down`."""
    args = build_parser().parse_args(argv)
    if args.action == "down":
        return _down(args.state)
    if args.action == "probe":
        return _probe(args)
    if args.action == "status":
        from profiler.cluster.launcher import cluster_status

        health = cluster_status(args.state)
        for h in health:
            state = "healthy" if h.healthy else ("running" if h.running else "stopped")
            print(f"{h.name:<12} {h.url:<28} pid {h.pid:<8} {state}")
        return 0 if all(h.healthy for h in health) else 1
    return _up(args)


def _down(state: Path) -> int:
    """Stop what state/cluster.json records and say what that was; nothing recorded (never
    started, or stopped already) is not an error: cleanup scripts run `down` unconditionally."""
    from profiler.cluster.launcher import load_cluster, stop_cluster

    if not (state / CLUSTER_FILE).is_file():
        print(f"nothing was running from {state.resolve()} (no {CLUSTER_FILE})")
        return 0
    proxy = load_cluster(state).proxy  # stopping forgets it
    cluster = stop_cluster(state)
    stopped = ", ".join(f"{node.role.value} {node.url}" for node in cluster.nodes)
    if proxy is not None:
        stopped += f" and the proxy {proxy.url}"
    print(f"stopped {len(cluster.nodes)} node(s) ({stopped}) from {cluster.state_dir}")
    return 0


def _probe(args: argparse.Namespace) -> int:
    from profiler.cluster.launcher import load_cluster

    cluster = load_cluster(args.state) if (args.state / CLUSTER_FILE).is_file() else None
    nodes = {n.role.value: n.proc.url for n in reversed(cluster.nodes)} if cluster else {}
    if args.node is None:
        args.node = nodes.get(Role.PREFILL) or nodes.get(Role.REPLICA)
        if args.node is None:
            raise ClusterError(f"{args.state}: no cluster with a P or replica node to probe "
                               "(give --node URL, or --state of a running cluster)")
    lengths = _integers("--lengths", args.lengths)
    busy = _integers("--busy", args.busy)
    if args.repeats < 1 or args.append < 0 or any(level < 0 for level in busy):
        raise ClusterError("--repeats must be at least 1, --append and --busy levels at "
                           "least 0")
    rows = shape_probe.probe_node(args.node, lengths=lengths, append=args.append,
                                  repeats=args.repeats, max_model_len=args.max_model_len)
    if cluster is not None and cluster.proxy is not None and "decode" in nodes:
        rows += shape_probe.probe_frontend(nodes["decode"], cluster.proxy.url,
                                           admin_key=args.admin_key, lengths=lengths,
                                           repeats=args.repeats)
    if busy and "decode" in nodes:
        rows += shape_probe.probe_busy(
            nodes["decode"], via_url=cluster.proxy.url if cluster and cluster.proxy else None,
            admin_key=args.admin_key, levels=busy, repeats=args.repeats)
    path = shape_probe.write_probe(rows, args.out)
    print(f"wrote {path}: {len(rows)} requests")
    return 0


def _integers(option: str, text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ClusterError(f"{option} {text!r}: give integers, e.g. 128,1024") from None


def _up(args: argparse.Namespace) -> int:
    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from profiler.cluster.emulated import start_emulated_cluster
    from profiler.cluster.launcher import default_cores, start_cluster

    if (args.policy is not None or args.proxy_args) and not args.with_proxy:
        raise ClusterError("--policy and --proxy-args need --with-proxy")
    config = ClusterConfig(
        model=args.model, layout=args.layout, state_dir=args.state, device=args.device,
        connector=args.connector, host=args.host, base_port=args.base_port,
        max_model_len=args.max_model_len or 4096, kv_cache_gib=args.kv_cache_gib,
        dtype=args.dtype,
        cores=default_cores() if args.device is Device.CPU else (),
        startup_timeout_s=args.startup_timeout, vllm_args=tuple(shlex.split(args.vllm_args)),
        kv_readback_ttl_s=None if args.no_kv_readback else args.kv_readback_ttl,
    )
    if args.emulate is None and args.link is not None:
        raise ClusterError("--link needs --emulate (vLLM's transfer is set by --connector)")
    if args.emulate is None and args.num_gpu_blocks_override is not None:
        raise ClusterError("--num-gpu-blocks-override needs --emulate (for vLLM nodes pass "
                           "it in --vllm-args)")
    proxy_args = shlex.split(args.proxy_args)
    if args.with_proxy:  # the proxy's whole configuration, checked before any node starts
        proxy_args = _proxy_args_checked(args, config, proxy_args)
    if args.emulate is not None:
        cluster = start_emulated_cluster(config, args.emulate, args.link, progress,
                                         max_model_len=args.max_model_len,
                                         num_gpu_blocks=args.num_gpu_blocks_override)
    else:
        if args.model in {m.value for m in ModelName} and not is_ready(
            default_model_dir(ModelName(args.model))
        ):
            progress(f"preparing model {args.model} (once)")
        cluster = start_cluster(config, progress)
    if args.with_proxy:
        try:
            cluster.start_proxy(args.policy, args.proxy_port, args.host,
                                extra_args=proxy_args)
        except BaseException:
            cluster.stop()
            raise
    for node in cluster.nodes:
        print(f"{node.role.value:<8} {node.url}")
    if cluster.proxy is not None:
        print(f"proxy    {cluster.proxy.url}")
    print(f"cluster file: {cluster.cluster_file}")
    return 0


def _proxy_args_checked(args: argparse.Namespace, config: ClusterConfig,
                        proxy_args: list[str]) -> list[str]:
    """--proxy-args, plus the step-cost file `live` needs when they name none; ClusterError
    if the proxy would refuse them (nothing has started yet)."""
    from profiler.cluster.launcher import plan_free_nodes
    from profiler.cluster.live_defaults import default_live_costs
    from profiler.cluster.proxy_flags import check_proxy
    from proxy.policies import registry
    from proxy.policies.base import Need

    plan_free_nodes(config)  # a running cluster or a taken port is refused before this writes
    needs_costs = (args.policy is not None
                   and registry.get(args.policy).needs.costs is Need.REQUIRED)
    if needs_costs and not any(arg.split("=")[0] in ("--live-costs", "--config")
                                         for arg in proxy_args):
        costs = default_live_costs(args.model, args.device, args.emulate, args.link,
                                   args.state, args.max_model_len)
        print(f"policy {args.policy}: step costs from {costs}", file=sys.stderr, flush=True)
        proxy_args = ["--live-costs", str(costs), *proxy_args]
    proxy = check_proxy(config, args.policy, args.proxy_port, proxy_args)
    keeps = config.kv_readback_ttl_s is not None and (args.emulate is not None
                                                      or config.connector is Connector.NIXL)
    if keeps and not registry.get(proxy.policy.kind).needs.readback:
        # vLLM offers no per-request opt-out: D pins every P->D turn's blocks for the TTL
        # (docs/readback.md, "Costs"), which only a readback-reading policy puts to use.
        print(f"note: policy {proxy.policy.kind} never reads KV back, yet each D will keep "
              f"every finished turn's blocks for {config.kv_readback_ttl_s} s (bidirectional "
              "NIXL, on so that a readback can be forced); on a busy D they fill its KV cache: "
              "add --no-kv-readback, or lower --kv-readback-ttl", file=sys.stderr, flush=True)
    return proxy_args
