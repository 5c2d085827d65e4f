"""`python -m benchmarks`: run every benchmark (or `--only NAME`) and print their tables.

- `decision`: the routing decision's cost against a proxied request's (microseconds).
- `proxy_overhead`: requests/s, TTFT and CPU through the proxy against direct
  (`benchmarks/proxy_overhead`).
- `kv_events`: KV-event floods (a self-parent block, a 2-block cycle, a 20,000-block chain,
  1M random blocks, 2,000 forks): the longest the event loop is blocked per batch, and the
  RSS each leaves (`benchmarks/kv_events.py`).
- `cli_startup`: seconds `ppd` takes to answer --help and usage errors
  (`benchmarks/cli_startup.py`).
- `responses`: a Responses API turn 2 through the proxy against a chat-completions one, same
  run, whole and streamed (`benchmarks/responses_overhead.py`).

Every number is measured in one run, side by side, so ratios between rows are meaningful on
this machine even though absolute numbers are not portable.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys

import numpy as np

from benchmarks import bench_decision, cli_startup, kv_events, proxy_overhead, responses_overhead

BENCHMARKS = ("decision", "proxy_overhead", "kv_events", "cli_startup", "responses")


def render(rows: list[tuple[str, np.ndarray]], baseline: str) -> str:
    """A plain-text table: p50/p99/mean per row and each row's p50 relative to the baseline."""
    base = float(np.percentile(dict(rows)[baseline], 50))
    width = max(len(label) for label, _ in rows)
    lines = [f"{'what':<{width}}  {'n':>6}  {'p50 us':>10}  {'p99 us':>10}  {'mean us':>10}"
             f"  {'p50 / decision':>14}"]
    lines.append("-" * len(lines[0]))
    for label, samples in rows:
        p50, p99 = np.percentile(samples, [50, 99])
        lines.append(f"{label:<{width}}  {len(samples):>6}  {p50:>10.1f}  {p99:>10.1f}"
                     f"  {samples.mean():>10.1f}  {p50 / base:>13.1f}x")
    return "\n".join(lines)


def run_decision(args: argparse.Namespace) -> int:
    """The decision-overhead benchmark."""
    print(f"ppd decision overhead benchmark - {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}")
    rows = bench_decision.run(n_decide=args.decisions, n_requests=args.requests)
    print(render(rows, baseline=rows[0][0]))
    direct = dict(rows).get("direct to a vLLM node (fake)")
    decision = float(np.percentile(rows[0][1], 50))
    for label, samples in rows:
        if label.startswith("through proxy") and direct is not None:
            overhead = float(np.percentile(samples, 50) - np.percentile(direct, 50))
            print(f"{label}: proxy overhead p50 {overhead:.0f} us; the decision is "
                  f"{100 * decision / overhead:.2f}% of it")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=BENCHMARKS, help="run this benchmark only")
    parser.add_argument("--decisions", type=int, default=20_000, help="policy calls timed")
    parser.add_argument("--requests", type=int, default=200, help="HTTP requests timed per row")
    parser.add_argument("--startup-runs", type=int, default=5,
                        help="cli_startup: processes timed per command line")
    proxy_overhead.add_arguments(parser)
    kv_events.add_arguments(parser)
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks", *(sys.argv[1:] if argv is None
                                                          else argv)])
    status = 0
    if args.only in (None, "decision"):
        status |= run_decision(args)
    if args.only in (None, "proxy_overhead"):
        status |= proxy_overhead.run(args, command)
    if args.only in (None, "kv_events"):
        status |= kv_events.run(args)
    if args.only in (None, "cli_startup"):
        status |= cli_startup.main(["--runs", str(args.startup_runs)])
    if args.only in (None, "responses"):
        status |= responses_overhead.main(args.requests)
    return status


if __name__ == "__main__":
    sys.exit(main())
