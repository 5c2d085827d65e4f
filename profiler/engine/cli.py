"""`ppd sim presets|step|fit`: the engine model's cost presets from the command line.

    ppd sim presets
    ppd sim step --preset h100:llama-3.1-8b --decode 32 --context 2048 --prefill 256
    ppd sim fit runs/replica-cpu --out tables/cost/cpu-tiny.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from profiler.engine.batch import BatchShape
from profiler.engine.cost import load_cost
from profiler.engine.transfer import LINKS, MODEL_SHAPES

SIMULATOR_ACTIONS = ("run", "grid", "paper")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppd sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("presets", help="list cost presets, KV model shapes and links")
    # The cluster simulator's actions (profiler.simulator.cli runs them; listed for --help).
    actions.add_parser("run", add_help=False,
                       help="simulate a replay on a P/D cluster + the proxy (see run --help)")
    actions.add_parser("grid", add_help=False,
                       help="simulate layouts x workloads x qps x policies into one table")
    actions.add_parser("paper", add_help=False,
                       help="the PPD paper's tables and plots from a grid table")

    step = actions.add_parser("step", help="print the modelled time of one engine step")
    step.add_argument("--preset", required=True,
                      help="a cost preset (see `ppd sim presets`) or a JSON from `ppd sim fit`")
    step.add_argument("--decode", type=int, default=0, help="requests decoding in the step")
    step.add_argument("--context", type=int, default=0,
                      help="context (tokens) of each decoding request")
    step.add_argument("--prefill", type=int, default=0, help="prompt tokens in the step")
    step.add_argument("--prefill-context", type=int, default=0,
                      help="tokens already cached before the prompt chunk (append-prefill)")

    fit = actions.add_parser("fit", help="fit a CPU cost preset to replay runs")
    fit.add_argument("runs", nargs="+", type=Path,
                     help="replay run directories (or their requests.csv / .parquet)")
    fit.add_argument("--out", type=Path, required=True, help="preset JSON to write")
    fit.add_argument("--name", default=None, help="preset name (default: the file's stem)")
    return parser


def main(argv: list[str]) -> int:
    """The engine model's actions (presets, step, fit); `ppd sim` itself is dispatched by
    `profiler.simulator.cli.main`, which runs run, grid and paper."""
    args = build_parser().parse_args(argv)
    if args.action in SIMULATOR_ACTIONS:
        raise ValueError(f"`ppd sim {args.action}` runs through `ppd sim` (profiler.cli)")
    if args.action == "presets":
        print(render_presets())
    elif args.action == "step":
        print(render_step(args))
    else:
        print(run_fit(args.runs, args.out, args.name or args.out.stem))
    return 0


def render_presets() -> str:
    from profiler.engine import aic

    lines = ["cost presets (aiconfigurator-core, measured vLLM kernels; append :tpN for TP):"]
    lines += [f"  {name}" for name in aic.preset_names()]
    lines += ["  FILE.json  (a LinearCost fitted by `ppd sim fit`)", "",
              "KV model shapes (bytes per token):"]
    lines += [f"  {s.name:<14} {s.kv_bytes_per_token:>8}  {s.source}"
              for s in MODEL_SHAPES.values()]
    lines += ["", "links:"]
    lines += [f"  {link.name:<10} {link.bandwidth_bytes_per_s / 1e9:>6.1f} GB/s "
              f"{link.latency_s * 1e6:>5.0f} us  {link.source}" for link in LINKS.values()]
    return "\n".join(lines)


def render_step(args: argparse.Namespace) -> str:
    for name in ("decode", "context", "prefill", "prefill_context"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
    if args.decode and not args.context:
        raise ValueError("--decode needs --context (each decoding request's context)")
    if not args.decode and not args.prefill:
        raise ValueError("an empty step: give --decode and/or --prefill")
    shape = BatchShape(num_prefill_requests=1 if args.prefill else 0,
                       sum_prefill_tokens=args.prefill,
                       sum_prefill_kv_tokens=args.prefill_context if args.prefill else 0,
                       num_decode_requests=args.decode,
                       sum_decode_kv_tokens=args.decode * args.context)
    cost = load_cost(args.preset)
    step_ms = cost.step_ms(shape)
    parts = []
    if args.decode:
        parts.append(f"{args.decode} decoding at {args.context} context")
    if args.prefill:
        cached = f" after {args.prefill_context} cached" if args.prefill_context else ""
        parts.append(f"{args.prefill} prompt tokens{cached}")
    return (f"{cost.name}: {' + '.join(parts)}: {step_ms:.2f} ms per step\n"
            f"source: {cost.source}")


def run_fit(runs: list[Path], out: Path, name: str) -> str:
    from profiler.engine.fit import fit, read_runs, write_preset

    source = "ppd sim fit on " + ", ".join(str(run) for run in runs)
    result = fit(read_runs(runs), name=name, source=source)
    write_preset(result, out)
    cost = result.cost
    unqueued = "unqueued " if result.prefill_rows_unqueued else ""
    return (f"wrote {out}\n"
            f"  step = {cost.base_ms:.2f} ms + {cost.per_prefill_token_ms:.4f} ms/prompt token "
            f"+ {cost.per_decode_seq_ms:.3f} ms/decoding request\n"
            f"  prefill fit on {result.n_prefill_rows} {unqueued}turn-1 rows (TTFT intercept "
            f"{result.ttft_intercept_ms:.1f} ms, not in the step cost); decode fit on "
            f"{result.n_decode_rows} rows")
