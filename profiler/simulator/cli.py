"""`ppd sim`: the cluster simulator's command lines (run, grid, paper), and the dispatch of
the engine model's (presets, step, fit: `profiler.engine.cli`).

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
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from profiler.flags.types import positive_int, refuse_both
from profiler.simulator.flags import (
    add_cluster_flags,
    add_trace_window_flags,
    load_of,
    readback_ttl,
)
from proxy.config import ConfigError, PolicyConfig
from proxy.options import add_flags, option_fields

# The simulator, pandas and the engine model are imported by each action once its flags are
# parsed: a usage error or --help returns without them (benchmarks/cli_startup.py).


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
    add_trace_window_flags(parser, rate)
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds during which conversations start (default 10)")
    parser.add_argument("--max-turns", type=positive_int,
                        help="simulate at most N turns per conversation")
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
    refuse_both(argv, "--conversation-rate", "--qps")
    from profiler.replay.cli import default_label
    from profiler.replay.output import summary_table
    from profiler.simulator.run import (
        RunSpec,
        policy_label,
        run_summary,
        simulate,
        simulated_setup,
        write_sim_run,
    )

    spec = RunSpec(layout=args.layout, dataset=args.dataset, qps=load_of(args),
                   policy=policy_from_args(args), cost=args.cost, model=args.model,
                   link=args.link, duration_s=args.duration, timeout_s=args.timeout,
                   seed=args.seed, max_turns=args.max_turns,
                   max_context_tokens=args.max_context_tokens, load_window_s=args.load_window,
                   client_connections=args.client_connections,
                   reply_retokenized=args.reply_retokenized, client=args.client,
                   kv_readback_ttl_s=readback_ttl(args),
                   fresh_arrivals=args.fresh_arrivals, start_s=args.start)
    started = time.perf_counter()
    result = simulate(spec)
    elapsed = time.perf_counter() - started
    summary = run_summary(spec, result)
    label = args.label or (default_label(args.out, args.dataset, spec.qps)
                           if args.out is not None and "@" in args.out.name
                           else f"{policy_label(spec.policy)}@{spec.qps:g}")
    out = args.out or Path("runs") / f"sim-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    write_sim_run(out, spec, result, summary, label=label)
    title = (f"ppd sim run: {label} on {spec.layout} ({spec.cost}, {spec.link}), "
             f"{args.dataset}")
    print(summary_table({**summary, "conversation_rate": spec.qps}, title=title))
    print(f"  {'KV moved P->D':<33} {result.kv_bytes_moved / 1e9:.2f} GB")
    print(simulated_setup(spec).line())
    print(f"simulated {result.wall_time_s:.1f} s of cluster time in {elapsed:.2f} s; "
          f"outputs in {out}/")
    return 0


def main(argv: list[str]) -> int:
    """`ppd sim ACTION`: run, grid and paper here; the engine model's presets, step and fit
    in `profiler.engine.cli`."""
    simulator = {"run": run_main, "grid": grid_main, "paper": paper_main,
                 "live-costs": live_costs_main}
    if argv and argv[0] in simulator:
        return simulator[argv[0]](argv[1:])
    from profiler.engine import cli as engine_cli
    from profiler.simulator.replay_twin import twin_ttft_gap_ms

    return engine_cli.main(argv, twin_gap=twin_ttft_gap_ms)


def grid_main(argv: list[str]) -> int:
    """`ppd sim grid`, then its verdict."""
    from profiler.simulator import grid

    rows = grid.simulate_grid(argv)  # parses first: a usage error imports nothing heavy
    import pandas as pd

    from profiler.simulator.verdict import verdict_lines

    print("\n".join(verdict_lines(pd.DataFrame(rows))))
    return 0


def live_costs_main(argv: list[str]) -> int:
    from profiler.simulator.live_costs import main

    return main(argv)


def build_paper_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppd sim paper",
        description="The PPD paper's Tables 1, 2, 4 and the ppd-vs-fixed comparison from a "
        "`ppd sim grid` table, beside the paper's figures (markdown + plots). A grid that "
        "lacks what a table needs (4R replica runs for Tables 2 and 4, say) gets that table "
        "left out, with the reason in tables.md and on stderr.")
    parser.add_argument("grid", type=Path, nargs="+",
                        help="ppd sim grid tables (.parquet or .csv), read as one")
    parser.add_argument("--out", type=Path, required=True, help="directory for tables/plots")
    parser.add_argument("--ideal", type=Path, nargs="+", default=None, metavar="GRID",
                        help="a second grid, the ideal setup (default preset, ideal client), "
                        "to put beside the first (the paper-like one: --cost "
                        "h100:llama-3.1-8b@vllm-0.13 --client paper): its report goes to "
                        "OUT/ideal and both side by side to OUT/side-by-side.md")
    return parser


def paper_main(argv: list[str]) -> int:
    args = build_paper_parser().parse_args(argv)
    from profiler.simulator.grid_table import load_grids
    from profiler.simulator.paper import coverage_notes
    from profiler.simulator.paper_report import write_report
    from profiler.simulator.provenance import paper_differences, report_preface, setup_of_grid
    from profiler.simulator.verdict import verdict_lines

    frame = load_grids(args.grid)
    setups = setup_of_grid(args.grid, frame)
    for note in coverage_notes(frame):
        print(f"ppd sim paper: warning: {note}", file=sys.stderr)
    differences = paper_differences(setups)
    if differences:
        print(f"ppd sim paper: warning: not the paper's setup ({'; '.join(differences)}): "
              "tables.md says so before setting its figures beside the paper's",
              file=sys.stderr)
    verdict = verdict_lines(frame)
    written = write_report(frame, args.out, source=" + ".join(map(str, args.grid)),
                           preface=report_preface(setups),
                           closing=["## Verdict", "\n".join(f"- {line}" for line in verdict)])
    if args.ideal:
        from profiler.simulator.paper_compare import side_by_side_markdown

        ideal = load_grids(args.ideal)
        ideal_setups = setup_of_grid(args.ideal, ideal)
        ideal_verdict = verdict_lines(ideal)
        written += write_report(ideal, args.out / "ideal",
                                source=" + ".join(map(str, args.ideal)),
                                preface=report_preface(ideal_setups),
                                closing=["## Verdict", "\n".join(f"- {line}"
                                                                 for line in ideal_verdict)])
        compare = args.out / "side-by-side.md"
        compare.write_text(side_by_side_markdown(frame, ideal))
        written.append(compare)
    print("\n".join(f"wrote {path}" for path in written))
    print("\n".join(setup.line() for setup in setups))
    print("\n".join(verdict))
    if args.ideal:
        print("ideal setup:\n" + "\n".join(
            [*(setup.line() for setup in ideal_setups), *ideal_verdict]))
    return 0

