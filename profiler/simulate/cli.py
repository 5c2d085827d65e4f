"""`ppd sim run` and `ppd sim grid`: the cluster simulator's command lines.

    ppd sim run --layout 1P3D --cost h100:llama-3.1-8b --policy ppd \\
        --table tables/h100-llama-3.1-8b-1p3d.csv --dataset synthetic:small-mid_bal \\
        --conversation-rate 4
    ppd sim grid --layouts 1P3D,2P2D --datasets paper --conversation-rates 0.5,4,16 \\
        --policies pd,x=0.5,local,ppd --table-dir tables --out runs/grid.parquet

Policy flags are the proxy's own (`--policy`, `--x`, `--table`, `--w-ttft`, `--w-tpot`, ...),
declared once in proxy.config.PolicyConfig.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from pathlib import Path

from profiler.replay.cli import default_label
from profiler.replay.output import summary_table
from profiler.simulate.run import (
    DEFAULT_COST,
    DEFAULT_LINK,
    RunSpec,
    policy_label,
    run_summary,
    simulate,
    write_sim_run,
)
from proxy.config import ConfigError, PolicyConfig
from proxy.load import DEFAULT_LOAD_WINDOW_S
from proxy.options import add_flags, option_fields


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """Flags every simulator command shares: the cost preset, model, link, engine seed."""
    parser.add_argument("--cost", default=DEFAULT_COST,
                        help="cost preset (`ppd sim presets`) or a JSON file from `ppd sim fit` "
                        f"(default {DEFAULT_COST})")
    parser.add_argument("--model", help="model whose KV size the transfers move (default: the "
                        "model part of --cost, e.g. llama-3.1-8b)")
    parser.add_argument("--link", default=DEFAULT_LINK,
                        help=f"P->D link preset: nvlink, rdma-400g, tcp-25g (default "
                        f"{DEFAULT_LINK})")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="per-request timeout in seconds; a slower turn fails (default 30, "
                        "the paper's)")
    parser.add_argument("--seed", type=int, default=0, help="arrivals, workload and engine seed")
    parser.add_argument("--load-window", type=float, default=DEFAULT_LOAD_WINDOW_S,
                        help="the proxy's --load-window: seconds its turns-per-second meter "
                        "averages over (default 30, the proxy's)")


def build_run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppd sim run",
        description="Simulate a replay against a P/D cluster and the ppd proxy in virtual time "
        "(engine model + cost preset), and print the replay's summary.")
    parser.add_argument("--layout", required=True, help="e.g. 1P3D, 2P2D, 3P1D, 4R")
    parser.add_argument("--dataset", required=True,
                        help="synthetic:NAME, sharegpt, or a trace file (as `ppd replay`)")
    rate = parser.add_mutually_exclusive_group(required=True)
    rate.add_argument("--conversation-rate", "--qps", dest="qps", type=float, metavar="R",
                      help="new conversations per second (as `ppd replay`; --qps is the "
                      "paper's name for the same number)")
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds during which conversations start (default 10)")
    parser.add_argument("--max-turns", type=int, help="simulate at most N turns per conversation")
    parser.add_argument("--max-context-tokens", type=int,
                        help="cut trace conversations to the turns whose context fits")
    add_cluster_flags(parser)
    parser.add_argument("--out", type=Path, help="run directory (default: runs/sim-UTCTIME)")
    parser.add_argument("--label", help="run name in reports (default as `ppd replay`)")
    policy = parser.add_argument_group("routing policy (the proxy's flags)")
    add_flags(policy, PolicyConfig)  # type: ignore[arg-type]
    return parser


def policy_from_args(args: argparse.Namespace) -> PolicyConfig:
    """The PolicyConfig the proxy would build from the same flags."""
    values = {opt.name: getattr(args, opt.key) for opt in option_fields(PolicyConfig)
              if getattr(args, opt.key, None) is not None}
    try:
        return PolicyConfig(**values)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def run_main(argv: list[str]) -> int:
    args = build_run_parser().parse_args(argv)
    spec = RunSpec(layout=args.layout, dataset=args.dataset, qps=args.qps,
                   policy=policy_from_args(args), cost=args.cost, model=args.model,
                   link=args.link, duration_s=args.duration, timeout_s=args.timeout,
                   seed=args.seed, max_turns=args.max_turns,
                   max_context_tokens=args.max_context_tokens, load_window_s=args.load_window)
    started = time.perf_counter()
    result = simulate(spec)
    elapsed = time.perf_counter() - started
    summary = run_summary(spec, result)
    label = args.label or (default_label(args.out, args.dataset, args.qps)
                           if args.out is not None and "@" in args.out.name
                           else f"{policy_label(spec.policy)}@{args.qps:g}")
    out = args.out or Path("runs") / f"sim-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    write_sim_run(out, spec, result, summary, label=label)
    title = (f"ppd sim run: {label} on {spec.layout} ({spec.cost}, {spec.link}), "
             f"{args.dataset}")
    print(summary_table({**summary, "conversation_rate": spec.qps}, title=title))
    print(f"  {'KV moved P->D':<33} {result.kv_bytes_moved / 1e9:.2f} GB")
    print(f"simulated {result.wall_time_s:.1f} s of cluster time in {elapsed:.2f} s; "
          f"outputs in {out}/")
    return 0


def grid_main(argv: list[str]) -> int:
    from profiler.simulate.grid import main

    return main(argv)


def paper_main(argv: list[str]) -> int:
    from profiler.simulate.paper import main

    return main(argv)
