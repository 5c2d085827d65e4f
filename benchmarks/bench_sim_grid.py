"""The cluster simulator's speed: one cell, and the paper's whole grid.

    python -m benchmarks.bench_sim_grid                 # the full paper grid, 2 processes
    python -m benchmarks.bench_sim_grid --sample 0.1    # a random tenth of the cells, extrapolated

The paper's grid: layouts 4R (replica) and 1P3D, 2P2D, 3P1D at x = 0, 1/3, 1/2, 2/3, 1
(16 configurations; the paper counts 17 with one hybrid), its 18 synthetic workloads and 10 QPS
points, 10 s of arrivals each: 2,880 runs. Target: under 10 minutes on this 2-core machine,
one cell well under a second. Prints a table: cells, wall time, cells/s, extrapolation to the
whole grid, and single-cell times (a light, a typical and the heaviest cell). The machine's
load average is printed too: other work on the cores slows every row.

With the Mooncake trace at hand (`--trace`, default ../shared/traces/), it also prints the CPU
seconds of single runs of `ppd sim compare`'s production grid (docs/production-traffic.md:
360 such runs must fit in 30 minutes on 2 processes), the trace already parsed as a grid
worker has it.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import time
from pathlib import Path

from profiler.engine.batch import BatchShape
from profiler.simulator.grid import (
    PAPER_LAYOUTS,
    PAPER_POLICIES,
    PAPER_QPS,
    GridCell,
    grid_cells,
    paper_datasets,
    run_cell,
    run_grid,
)
from profiler.simulator.run import RunSpec, cost_model
from proxy.policies import live as live_policy
from proxy.policies import pd as pd_policy
from proxy.policies import registry

SINGLE_CELLS = (
    ("light: 1P3D pd small-tiny @0.5", "1P3D", "synthetic:small-tiny", 0.5),
    ("typical: 2P2D x=0.5 small-mid_bal @4", "2P2D", "synthetic:small-mid_bal", 4.0),
    ("heavy: 3P1D pd large-very_long_gen @20", "3P1D", "synthetic:large-very_long_gen", 20.0),
)
TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake-conversation.jsonl"
# (layout, time scale, policy) of the production grid's first window (600-750 s of the trace):
# its heaviest load on its fewest P nodes, and its lightest on its fewest D nodes.
PRODUCTION_CELLS = (("2P6D", 4.0, pd_policy.NAME), ("2P6D", 4.0, live_policy.NAME),
                    ("6P2D", 0.5, pd_policy.NAME), ("6P2D", 0.5, live_policy.NAME))


def production_cells(cost: str, trace: Path) -> list[tuple[str, float]]:
    """CPU seconds of single production-grid runs, run inline after one run that parses the
    trace and warms the process (as a `ppd sim compare` worker is after its first run)."""
    from profiler.planning.compare import STARTS, WINDOW_S

    base = RunSpec(layout="2P6D", dataset=str(trace), qps=1.0, cost=cost, duration_s=WINDOW_S,
                   kv_readback_ttl_s=None, start_s=STARTS[0])
    cells = [grid_cells([layout], [str(trace)], [1.0], [policy], base, lambda _: None,
                        time_scales=[scale])[0] for layout, scale, policy in PRODUCTION_CELLS]
    run_cell(cells[0])
    rows = []
    for cell in cells:
        started = time.process_time()
        run_cell(cell)
        rows.append((f"production run, CPU s - {cell.spec.layout} {cell.policy} "
                     f"x{cell.spec.qps:g}", time.process_time() - started))
    return rows


def single_cells(cost: str) -> list[tuple[str, float]]:
    """Wall seconds of single cells, run inline (the cost preset already loaded)."""
    from profiler.simulator.grid import parse_policy

    rows = []
    for label, layout, dataset, qps in SINGLE_CELLS:
        half = registry.fixed_label(0.5)
        policy = half if half in label else pd_policy.NAME
        cell = GridCell(RunSpec(layout, dataset, qps, policy=parse_policy(policy), cost=cost),
                        policy)
        started = time.perf_counter()
        run_cell(cell)
        rows.append((label, time.perf_counter() - started))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_sim_grid",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cost", default="h100:llama-3.1-8b")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sample", type=float, default=1.0,
                        help="fraction of the grid's cells to run (seeded sample), extrapolated")
    parser.add_argument("--trace", type=Path, default=TRACE,
                        help="the Mooncake conversation trace, for the production grid's rows "
                        "(skipped when it is not there)")
    args = parser.parse_args(argv)
    base = RunSpec(layout="1P3D", dataset="synthetic:small-tiny", qps=1.0, cost=args.cost)
    cells = grid_cells(PAPER_LAYOUTS, paper_datasets(), PAPER_QPS, PAPER_POLICIES, base,
                       lambda layout: None)
    # A seeded random sample: a stride would keep hitting the same qps point.
    chosen = (random.Random(0).sample(cells, max(1, round(len(cells) * args.sample)))
              if args.sample < 1 else cells)
    print(f"ppd simulator grid benchmark - {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    started = time.perf_counter()
    run_grid(chosen, args.processes)
    elapsed = time.perf_counter() - started
    whole = elapsed * len(cells) / len(chosen)
    # Load the preset (and its KV size) in this process before timing single cells: a grid
    # worker pays that once, not per cell.
    warm = RunSpec("1P3D", "synthetic:small-tiny", 0.5, cost=args.cost)
    cost_model(args.cost).step_ms(BatchShape(num_decode_requests=1, sum_decode_kv_tokens=64))
    run_cell(GridCell(warm, pd_policy.NAME))
    singles = single_cells(args.cost)
    if args.trace.is_file():
        singles += production_cells(args.cost, args.trace)
    lines = [f"{'what':<60} {'value':>12}", "-" * 73,
             f"{'grid cells (whole paper grid)':<60} {len(cells):>12}",
             f"{'cells run':<60} {len(chosen):>12}",
             f"{'processes':<60} {args.processes:>12}",
             f"{'wall time, s':<60} {elapsed:>12.1f}",
             f"{'cells per second':<60} {len(chosen) / elapsed:>12.2f}",
             f"{'whole grid, s (measured or extrapolated)':<60} {whole:>12.1f}",
             f"{'target, s':<60} {600:>12}"]
    lines += [f"{'one cell, s - ' + label:<60} {seconds:>12.3f}" for label, seconds in singles]
    lines.append(f"{'load average at the end':<60} {os.getloadavg()[0]:>12.1f}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
