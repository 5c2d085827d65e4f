"""`ppd sim compare`: every routing policy on production multi-turn traffic, one command.

    ppd sim compare ../shared/traces/mooncake-conversation.jsonl --out docs/production-traffic

A timed block-hash trace (Mooncake's) on a simulated cluster of 8 GPUs of the default preset,
layouts 2P6D, 4P4D and 6P2D, time scales 0.5-4, several disjoint windows, and the policies of
issue #43: the fixed routes, the rules llm-d, Dynamo, vllm-router and vLLM's example proxy
ship, ppd and live. Each (window, layout, time scale, policy) cell is one run
(`compare_cells`), scored against the SLO (`slo`); the runs go through one pool of worker
processes forked before any cost preset is loaded (as `grid.run_grid`). Steps:
1. each window's idle reference (the SLO's denominator, the same at every time scale: the
   window holds the same requests) and its new prompt tokens;
2. with ppd, a decision table per layout built from the first window's traffic as `ppd sim
   plan` builds one (`plan_tables`: shipped tables are for 4-GPU layouts only);
3. every cell; grid.parquet (a row a cell), then the table, the verdict and the plot
   (`compare_report`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.flags.types import positive_int
from profiler.planning.contenders import POLICIES, PPD
from profiler.simulator.flags import add_cluster_flags, readback_ttl

if TYPE_CHECKING:
    from profiler.simulator.run import RunSpec

LAYOUTS = ("2P6D", "4P4D", "6P2D")
TIME_SCALES = (0.5, 1.0, 2.0, 4.0)
# Three disjoint windows, 15 minutes apart, from 10 minutes into the hour-long trace
# (docs/production-traffic.md says why these and how long).
STARTS = (600.0, 1500.0, 2400.0)
WINDOW_S = 150.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppd sim compare",
        description="Every routing policy on a timed multi-turn trace (Mooncake's format) on "
        "a simulated cluster: SLO attainment, turn-2+ TTFT, TPOT, history recomputed and KV "
        "moved per (layout, time scale), a verdict and a plot (docs/production-traffic.md).")
    parser.add_argument("trace", nargs="?",
                        help="a timed block-hash trace (Mooncake's format); not with --grid")
    parser.add_argument("--out", type=Path, required=True,
                        help="directory for grid.parquet, table.md and attainment.png")
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help=f"comma list (default {','.join(LAYOUTS)})")
    parser.add_argument("--time-scales", default=",".join(f"{s:g}" for s in TIME_SCALES),
                        help="comma list of loads, each the trace that many times faster "
                        f"(default {','.join(f'{s:g}' for s in TIME_SCALES)})")
    parser.add_argument("--starts", default=",".join(f"{s:g}" for s in STARTS),
                        help="comma list: each window's start, seconds into the trace "
                        f"(default {','.join(f'{s:g}' for s in STARTS)})")
    parser.add_argument("--duration", type=float, default=WINDOW_S,
                        help=f"each window's length, trace seconds (default {WINDOW_S:g})")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help=f"comma list (default {','.join(POLICIES)})")
    parser.add_argument("--table-dir", type=Path, default=Path("tables"),
                        help="shipped decision tables for ppd (default tables/); a layout "
                        "without one gets a table built from the first window's traffic")
    add_cluster_flags(parser)
    parser.add_argument("--processes", type=positive_int, default=os.cpu_count() or 1,
                        help="worker processes (default: one per core)")
    parser.add_argument("--grid", type=Path, metavar="PARQUET",
                        help="report an existing grid.parquet instead of simulating")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from profiler.planning.compare_report import write_report

    out: Path = args.out
    if args.grid is not None:
        import pandas as pd

        if not args.grid.is_file():
            raise ValueError(f"--grid {args.grid}: no such file")
        frame = pd.read_parquet(args.grid)
    elif args.trace is None:
        raise ValueError("give the trace to simulate, or --grid PARQUET to report")
    else:
        frame = simulate_compare(args, out)
    for line in write_report(frame, out):
        print(line)
    return 0


def simulate_compare(args: argparse.Namespace, out: Path) -> Any:
    """Run steps 1-3 of the module docstring; the grid as a DataFrame (also written)."""
    from profiler.simulator.grid import grid_cells, write_rows
    from profiler.simulator.provenance import describe

    layouts, policies = _split(args.layouts), _split(args.policies)
    scales, starts = _numbers(args.time_scales, "--time-scales"), _numbers(args.starts,
                                                                          "--starts")
    if not (layouts and policies and scales and starts):
        raise ValueError("--layouts, --policies, --time-scales and --starts each need a value")
    _check_disjoint(starts, args.duration)
    from profiler.simulator.slo import Slo

    base = _base_spec(args, starts[0])
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    context = multiprocessing.get_context("fork")
    with context.Pool(args.processes) as pool:
        windows = [replace(base, start_s=start) for start in starts]
        # queued ahead of the tables' cells, not waited for: a worker done with its window
        # measures table cells while the other still runs one (3 windows on 2 workers)
        pending = pool.map_async(_window_reference, windows, chunksize=1)
        tables = _ppd_tables(pool, base, layouts, policies, args.table_dir, out / "tables")
        references = pending.get()
        print(f"idle references and new tokens of {len(windows)} windows, ppd's tables: "
              f"{time.perf_counter() - started:.0f} s", flush=True)
        tasks = _tasks(windows, references, layouts, scales, policies, tables, Slo(),
                       grid_cells)
        print(f"{len(tasks)} runs on {args.processes} process(es)", flush=True)
        rows = []
        # Each row is kept as it comes: a grid stopped part way leaves what it ran.
        partial = out / "grid.partial.jsonl"
        partial.write_text("")
        for done, row in enumerate(pool.imap_unordered(_run, tasks, chunksize=1), start=1):
            rows.append(row)
            with partial.open("a") as file:
                file.write(json.dumps(row, default=float) + "\n")
            if done % 20 == 0 or done == len(tasks):
                print(f"  {done}/{len(tasks)} runs, {time.perf_counter() - started:.0f} s",
                      flush=True)
    setup = describe(args.cost, args.link, base.model_name, layouts, tables)
    grid = write_rows(rows, out / "grid.parquet", setup)
    partial.unlink()
    print(f"simulated {len(rows)} runs in {time.perf_counter() - started:.0f} s -> {grid}")
    import pandas as pd

    return pd.read_parquet(grid)


def _run(task: Any) -> dict[str, Any]:
    from profiler.planning.compare_cells import run_compare_cell

    return run_compare_cell(task)


def _window_reference(spec: RunSpec) -> tuple[dict[tuple[str, int], float], int]:
    from profiler.planning.compare_cells import window_novel_tokens
    from profiler.simulator.slo import idle_ttfts
    from profiler.simulator.workload import timed_workload
    from profiler.traces.mooncake import TraceWindow

    workload = timed_workload(spec.dataset, TraceWindow(spec.start_s, spec.duration_s, 1.0),
                              seed=spec.seed)
    return idle_ttfts(spec), window_novel_tokens(workload)


def _measure(task: Any) -> dict[str, Any]:
    from profiler.profile.on_simulator import measure_cell

    return measure_cell(task)


def _ppd_tables(pool: Any, base: RunSpec, layouts: Sequence[str], policies: Sequence[str],
                table_dir: Path, work_dir: Path) -> dict[str, Path]:
    """Each layout's ppd table: shipped, or built as `ppd sim plan` builds one."""
    if not any(label.startswith(PPD) for label in policies):
        return {}
    from profiler.planning.plan_tables import plan_cells, table_task, write_plan_table
    from profiler.simulator.grid import shipped_table

    tables: dict[str, Path] = {}
    cells = plan_cells(base)
    to_build = []
    for layout in layouts:
        shipped = shipped_table(table_dir, base.cost, layout)
        if shipped.is_file():
            tables[layout] = shipped
        else:
            to_build.append(layout)
    if not to_build:
        return tables
    started = time.perf_counter()
    # every layout's cells in one queue: no worker waits for the last cell of a layout
    rows = pool.map(_measure, [table_task(base, layout, cell) for layout in to_build
                               for cell in cells], chunksize=1)
    work_dir.mkdir(parents=True, exist_ok=True)
    for index, layout in enumerate(to_build):
        tables[layout] = write_plan_table(
            rows[index * len(cells):(index + 1) * len(cells)],
            work_dir / f"{layout.lower()}.csv", layout=layout, cost=base.cost,
            link=base.link, model=base.model_name, cells=cells)
    print(f"built ppd tables for {', '.join(to_build)} ({len(cells)} cells of the first "
          f"window's traffic each) in {time.perf_counter() - started:.0f} s", flush=True)
    return tables


def _tasks(windows: Sequence[RunSpec], references: Sequence[tuple[Any, int]],
           layouts: Sequence[str], scales: Sequence[float], policies: Sequence[str],
           tables: dict[str, Path], slo: Any, grid_cells: Callable[..., list[Any]]
           ) -> list[Any]:
    from profiler.planning.compare_cells import CompareCell

    tasks = []
    for index, (window, (idle, novel)) in enumerate(zip(windows, references, strict=True)):
        cells = grid_cells(layouts, [window.dataset], [1.0], policies, window,
                           tables.get, time_scales=scales)
        tasks += [CompareCell(cell, index, idle, novel, slo) for cell in cells]
    # heaviest first (a higher time scale packs the same requests tighter: longer queues)
    return sorted(tasks, key=lambda task: -task.cell.spec.qps)


def _base_spec(args: argparse.Namespace, start: float) -> RunSpec:
    from profiler.simulator.run import RunSpec
    from profiler.simulator.workload import is_timed_dataset

    if not is_timed_dataset(args.trace):
        raise ValueError(f"{args.trace} is not a timed block-hash trace (Mooncake's format: "
                         "timestamp, input_length, output_length, hash_ids)")
    return RunSpec(layout=LAYOUTS[0], dataset=args.trace, qps=1.0, cost=args.cost,
                   model=args.model, link=args.link, duration_s=args.duration,
                   timeout_s=args.timeout, seed=args.seed, load_window_s=args.load_window,
                   client=args.client, kv_readback_ttl_s=_readback(args),
                   start_s=start)


def _readback(args: argparse.Namespace) -> float | None:
    # Off unless asked: at this trace's prompt sizes vLLM's 480 s pin fills every D and the
    # runs collapse under every policy (docs/production-traces.md, "With readback on").
    if args.kv_readback_ttl is None:
        return None
    return readback_ttl(args)


def _check_disjoint(starts: Sequence[float], duration: float) -> None:
    ordered = sorted(starts)
    for first, second in zip(ordered, ordered[1:], strict=False):
        if second < first + duration:
            raise ValueError(f"windows at {first:g} s and {second:g} s overlap (each lasts "
                             f"{duration:g} s): --starts must be at least --duration apart")


def _numbers(text: str, flag: str) -> list[float]:
    try:
        return [float(part) for part in _split(text)]
    except ValueError:
        raise ValueError(f"{flag} takes numbers, got {text!r}") from None


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


__all__ = ["LAYOUTS", "POLICIES", "STARTS", "TIME_SCALES", "WINDOW_S", "build_parser", "main"]
