"""How long `ppd` takes to answer `--help` and usage errors: each command imports its heavy
modules (pandas, numpy, the simulator, aiconfigurator, vLLM's tools) only once its flags are
parsed, so a typo costs a fraction of a second (target: under 1 s on an idle machine).

Rows: the interpreter alone (`python -c pass`, the floor), then each command line run as a
fresh `python -m profiler.cli ...` process, `--runs` times; median and max wall time.
`python -m benchmarks.cli_startup` runs it alone.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 1.0
# (label, argv after `python`): usage errors and help, the paths a user's typo takes.
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("python -c pass (floor)", ("-c", "pass")),
    ("ppd --help", ("-m", "profiler.cli", "--help")),
    ("ppd cluster up (usage error)", ("-m", "profiler.cli", "cluster", "up")),
    ("ppd cluster up --policy lcoal", ("-m", "profiler.cli", "cluster", "up", "--model",
                                       "tiny", "--layout", "1P1D", "--with-proxy",
                                       "--policy", "lcoal")),
    ("ppd sim grid (usage error)", ("-m", "profiler.cli", "sim", "grid", "--bogus")),
    ("ppd sim run (usage error)", ("-m", "profiler.cli", "sim", "run")),
    ("ppd sim paper (usage error)", ("-m", "profiler.cli", "sim", "paper")),
    ("ppd profile (usage error)", ("-m", "profiler.cli", "profile")),
    ("ppd replay (usage error)", ("-m", "profiler.cli", "replay")),
    ("ppd proxy --help", ("-m", "profiler.cli", "proxy", "--help")),
)


def time_command(argv: tuple[str, ...], runs: int) -> list[float]:
    """Wall seconds of `runs` fresh processes (output discarded; usage errors exit 2)."""
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, *argv], cwd=REPO, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
        samples.append(time.perf_counter() - started)
    return samples


def run(runs: int) -> list[tuple[str, list[float]]]:
    return [(label, time_command(argv, runs)) for label, argv in COMMANDS]


def render(rows: list[tuple[str, list[float]]]) -> str:
    width = max(len(label) for label, _ in rows)
    head = f"{'command':<{width}}  {'runs':>4}  {'median s':>8}  {'max s':>6}  {'< 1 s':>5}"
    lines = [head, "-" * len(head)]
    for label, samples in rows:
        median = statistics.median(samples)
        ok = "yes" if median < TARGET_S else "NO"
        lines.append(f"{label:<{width}}  {len(samples):>4}  {median:>8.2f}  "
                     f"{max(samples):>6.2f}  {ok:>5}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cli_startup",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="processes per command line")
    args = parser.parse_args(argv)
    print(f"ppd CLI start-up (fresh process per run, median of {args.runs}; target < "
          f"{TARGET_S:g} s on an idle machine)")
    print(render(run(args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
