"""`ppd sim grid`: layouts x workloads x qps x policies, in parallel processes, one tidy table.

Every cell is one simulated run (`profiler.simulator.run`); a row holds its coordinates and
the replay summary's headline numbers. Cells run in worker processes (each loads the cost
preset once), heaviest first so the last worker is not left with the longest cell. The
output is a Parquet file (or CSV, by the suffix) with one row per cell.

Policies are named as in reports: `pd` (x=0), `local` (x=1), `x=0.33` (fixed share), `replica`,
`ppd`, `ppd-wtpot3` (ppd with --w-tpot 3), `threshold-256`, `live`, `live-wtpot3`,
`live-table` (live with the layout's table as its prior; docs/live-routing.md). `replica`
runs only on layouts of R nodes alone (e.g. 4R), the others only on layouts with P/D pairs;
other combinations are skipped. Hybrid layouts (R beside P and D, e.g. 1P2D1R) run every
policy but replica: under `live` the replicas take the conversations it places there, under
the others they stay idle. `--layouts hybrids` names the paper's 4-node hybrids
(`HYBRID_LAYOUTS`); they are not in the default list, which is the paper's core grid.
`--datasets paper` is the paper's 18 synthetic workloads (2 turn-1 profiles x 9 shapes); the
`huge` ones (`synthetic:huge-SHAPE`, turn 1 of 8192/1024) are not in it and are named one by one.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.flags.types import output_file, positive_int, refuse_both
from profiler.simulator.flags import add_cluster_flags, readback_ttl
from profiler.simulator.provenance import METADATA_KEY, SimulatedSetup, describe, sidecar_path
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.policies import registry
from proxy.policies import replica as replica_policy
from proxy.shared.discretize import PAPER_CONTEXTS, WORKLOAD_SHAPES
from proxy.shared.vocabulary import Layout

if TYPE_CHECKING:  # the simulator (numpy, the engine model) is imported when a grid runs
    from profiler.simulator.run import RunSpec

PAPER_QPS = (0.5, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0)
PAPER_LAYOUTS = ("4R", "1P3D", "2P2D", "3P1D")
# Every 4-node layout with all three roles (the paper's 1R_1P_2D, 1R_2P_1D, 2R_1P_1D).
HYBRID_LAYOUTS = ("1P2D1R", "2P1D1R", "1P1D2R")
# The paper's fixed policies, by the share x of turn 2+ each runs locally: x=0 is pd, x=1 local.
PAPER_SHARES = (0.0, 0.33, 0.5, 0.67, 1.0)
PAPER_FIXED = tuple(registry.fixed_label(x) for x in PAPER_SHARES)
PAPER_POLICIES = (replica_policy.NAME, *PAPER_FIXED)
SUMMARY_COLUMNS = (
    "n_requests", "n_success", "success_rate", "turn1_ttft_ms_mean", "turn1_ttft_ms_p99",
    "turn2plus_ttft_ms_mean", "turn2plus_ttft_ms_p50", "turn2plus_ttft_ms_p99",
    "tpot_ms_mean", "tpot_ms_p99", "turn2plus_tpot_ms_mean", "e2e_ms_mean", "output_tok_s",
    "total_tok_s", "requests_s", "local_share", "replica_share", "kv_bytes_moved",
    "wall_time_s",
)


def paper_datasets() -> list[str]:
    """The paper's 18 workloads: `synthetic:small-tiny` ... `synthetic:large-huge_paste`."""
    return [f"synthetic:{context}-{shape}" for context in PAPER_CONTEXTS
            for shape in WORKLOAD_SHAPES]


def parse_policy(label: str, table: Path | None = None) -> PolicyConfig:
    """A policy label (see the module docstring; each policy module parses its own) as the
    proxy's PolicyConfig."""
    name, flags = registry.parse_label(label, lambda: table)
    return PolicyConfig(kind=Policy(name), **flags)


@dataclass(frozen=True, slots=True)
class GridCell:
    """One run of the grid and its row's coordinates."""

    spec: RunSpec
    policy: str

    def row(self) -> dict[str, Any]:
        return {"layout": self.spec.layout, "dataset": self.spec.dataset.removeprefix(
            "synthetic:"), "qps": self.spec.qps, "policy": self.policy,
            "seed": self.spec.seed, "cost": self.spec.cost, "client": self.spec.client}


def expand_layouts(names: Sequence[str]) -> list[str]:
    """Layout names with `hybrids` standing for HYBRID_LAYOUTS."""
    return [layout for name in names
            for layout in (HYBRID_LAYOUTS if name.lower() == "hybrids" else (name,))]


def grid_cells(layouts: Sequence[str], datasets: Sequence[str], qps: Sequence[float],
               policies: Sequence[str], base: RunSpec,
               table_for: Callable[[str], Path | None],
               time_scales: Sequence[float] = (1.0,)) -> list[GridCell]:
    """Every valid (layout, dataset, qps, policy) combination, as run specs; a timed trace's
    load points are time_scales (its `qps` column holds the time scale)."""
    from profiler.simulator.workload import is_timed_dataset

    cells = []
    for layout_name in layouts:
        layout = Layout.parse(layout_name)
        for label in policies:
            name, flags = registry.parse_label(label, partial(table_for, layout.name))
            on_replicas = registry.get(name).replicas_only
            if on_replicas != (layout.replica > 0 and not layout.disaggregated):
                continue
            config = PolicyConfig(kind=Policy(name), **flags)
            for dataset in datasets:
                for point in time_scales if is_timed_dataset(dataset) else qps:
                    spec = replace(base, layout=layout.name, dataset=dataset, qps=point,
                                   policy=config)
                    cells.append(GridCell(spec, label))
    return cells


def run_cell(cell: GridCell) -> dict[str, Any]:
    """One cell's row (what a worker process returns)."""
    started = time.perf_counter()
    from profiler.simulator.run import run_summary, simulate

    result = simulate(cell.spec)
    summary = run_summary(cell.spec, result)
    row = cell.row()
    row.update({key: summary.get(key) for key in SUMMARY_COLUMNS})
    row["cpu_s"] = time.perf_counter() - started
    return row


def _weight(cell: GridCell) -> float:
    # Load times output length, roughly what a cell costs to simulate.
    return cell.spec.qps * (1 + ("long" in cell.spec.dataset) * 4)


def run_grid(cells: Sequence[GridCell], processes: int,
             progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Every cell's row, in the cells' order, computed by `processes` workers (1: inline)."""
    order = sorted(range(len(cells)), key=lambda i: -_weight(cells[i]))
    rows: list[dict[str, Any] | None] = [None] * len(cells)
    if processes <= 1:
        for done, index in enumerate(order, start=1):
            rows[index] = run_cell(cells[index])
            if progress:
                progress(done, len(cells))
    else:
        # fork: workers inherit the imported modules; the cost preset is loaded in each worker
        # (never in the parent), so no native thread state is copied across fork.
        context = multiprocessing.get_context("fork")
        with context.Pool(processes) as pool:
            ordered = [cells[i] for i in order]
            for done, (index, row) in enumerate(
                    zip(order, pool.imap(run_cell, ordered, chunksize=1), strict=True),
                    start=1):
                rows[index] = row
                if progress:
                    progress(done, len(cells))
    return [row for row in rows if row is not None]


def write_rows(rows: Iterable[dict[str, Any]], out: Path,
               setup: SimulatedSetup | None = None) -> Path:
    """The grid table; with `setup`, its record in the Parquet metadata and a sidecar
    (`provenance.sidecar_path`)."""
    import pandas as pd

    frame = pd.DataFrame(list(rows))
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".csv":
        frame.to_csv(out, index=False)
    elif setup is None:
        frame.to_parquet(out, index=False)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(frame, preserve_index=False)
        metadata = {**(table.schema.metadata or {}),
                    METADATA_KEY: json.dumps(setup.as_dict()).encode()}
        pq.write_table(table.replace_schema_metadata(metadata), out)
    if setup is not None:
        sidecar_path(out).write_text(json.dumps({"setup": setup.as_dict(), "rows": len(frame)},
                                                indent=2) + "\n")
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppd sim grid",
        description="Simulate layouts x workloads x qps x policies in parallel processes and "
        "write one tidy table (a row per run).")
    parser.add_argument("--layouts", default=",".join(PAPER_LAYOUTS),
                        help=f"comma list (default {','.join(PAPER_LAYOUTS)}); `hybrids` "
                        f"adds {','.join(HYBRID_LAYOUTS)}")
    parser.add_argument("--datasets", default="paper",
                        help="comma list of datasets, or `paper` (the 18 synthetic workloads)")
    parser.add_argument("--conversation-rates", "--qps", dest="qps",
                        default=",".join(f"{q:g}" for q in PAPER_QPS),
                        help="comma list of conversation rates, new conversations per second "
                        "(the paper's QPS; default: its ten points)")
    parser.add_argument("--time-scales", default="1",
                        help="comma list: a timed block-hash trace's load points, each the "
                        "trace replayed that many times faster (default 1; its table rows "
                        "hold it in the qps column)")
    parser.add_argument("--start", type=float, default=0.0, metavar="S",
                        help="a timed trace's window starts S seconds into it; --duration is "
                        "its length (default 0)")
    parser.add_argument("--policies", default=",".join(PAPER_POLICIES),
                        help=f"comma list (default {','.join(PAPER_POLICIES)}); also ppd, "
                        "ppd-wtpot3, threshold-N")
    parser.add_argument("--table", type=Path, help="decision table for ppd on every layout")
    parser.add_argument("--table-dir", type=Path, default=Path("tables"),
                        help="with ppd: use DIR/h100-llama-3.1-8b-LAYOUT.csv per layout "
                        "(the shipped tables; default tables/)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--max-turns", type=positive_int, help="at most N turns per conversation")
    parser.add_argument("--max-context-tokens", type=int,
                        help="cut trace conversations to the turns whose context fits")
    add_cluster_flags(parser)
    parser.add_argument("--processes", type=positive_int, default=os.cpu_count() or 1,
                        help="worker processes (default: one per core)")
    parser.add_argument("--out", type=output_file, required=True,
                        help="table to write (.parquet/.csv)")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def shipped_table(table_dir: Path, cost: str, layout: str) -> Path:
    """Where the shipped decision table of a (cost preset, layout) lives: one per GPU and
    model, whatever vLLM the preset names (a table's meta.json says which engine it was
    measured on; the shipped H100 tables are the default preset's, vLLM 0.24)."""
    name = cost.partition("@")[0].replace(":", "-")
    return table_dir / f"{name}-{layout.lower()}.csv"


def main(argv: list[str]) -> int:
    """`ppd sim grid` without its verdict (the command line, `profiler.simulator.cli`, prints
    it: the verdict reads the paper's scores, and paper.py reads this module)."""
    simulate_grid(argv)
    return 0


def simulate_grid(argv: list[str]) -> list[dict[str, Any]]:
    """Run the grid the flags describe, write its table and setup; its rows."""
    args = build_parser().parse_args(argv)
    refuse_both(argv, "--conversation-rates", "--qps")
    datasets = paper_datasets() if args.datasets == "paper" else _split(args.datasets)
    try:
        qps = [float(q) for q in _split(args.qps)]
    except ValueError:
        raise ValueError(f"--qps takes numbers, got {args.qps!r}") from None
    try:
        time_scales = [float(f) for f in _split(args.time_scales)]
    except ValueError:
        raise ValueError(f"--time-scales takes numbers, got {args.time_scales!r}") from None
    axes = {"--layouts": _split(args.layouts), "--datasets": datasets, "--qps": qps,
            "--policies": _split(args.policies)}
    empty = [flag for flag, values in axes.items() if not values]
    if empty:  # else the empty grid is blamed on the layouts, or datasets[0] fails
        raise ValueError(f"{', '.join(empty)} names nothing: give a comma list")
    if args.out.suffix not in (".parquet", ".csv"):  # else a Parquet file named .txt
        raise ValueError(f"--out {args.out}: the table is written as .parquet or .csv")
    from profiler.simulator.run import RunSpec

    base = RunSpec(layout="1P1D", dataset=datasets[0], qps=1.0, cost=args.cost,
                   model=args.model, link=args.link, duration_s=args.duration,
                   timeout_s=args.timeout, seed=args.seed, max_turns=args.max_turns,
                   load_window_s=args.load_window, max_context_tokens=args.max_context_tokens,
                   client_connections=args.client_connections,
                   reply_retokenized=args.reply_retokenized, client=args.client,
                   kv_readback_ttl_s=readback_ttl(args),
                   fresh_arrivals=args.fresh_arrivals, start_s=args.start)

    def table_for(layout: str) -> Path | None:
        if args.table is not None:
            return args.table  # type: ignore[no-any-return]
        path = shipped_table(args.table_dir, args.cost, layout)
        if not path.is_file():
            raise ValueError(f"no decision table for layout {layout}: {path} (pass --table)")
        return path

    cells = grid_cells(expand_layouts(_split(args.layouts)), datasets, qps,
                       _split(args.policies), base, table_for, time_scales)
    if not cells:
        raise ValueError("the grid is empty: no policy fits the layouts (replica needs R "
                         "nodes, the other policies P and D nodes)")
    started = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if not args.no_progress and (done == total or done % 50 == 0):
            print(f"  {done}/{total} runs, {time.perf_counter() - started:.0f} s", flush=True)

    rows = run_grid(cells, args.processes, progress)
    layouts = list(dict.fromkeys(cell.spec.layout for cell in cells))
    tables = {cell.spec.layout: cell.spec.policy.table for cell in cells
              if cell.spec.policy.table is not None}
    # The preset is loaded here only now that the workers are gone (see run_grid).
    setup = describe(args.cost, args.link, base.model_name, layouts, tables)
    write_rows(rows, args.out, setup)
    elapsed = time.perf_counter() - started
    print(f"simulated {len(rows)} runs in {elapsed:.1f} s with {args.processes} processes "
          f"-> {args.out} (setup in {sidecar_path(args.out)})")
    print(setup.line())
    return rows


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


__all__ = ["HYBRID_LAYOUTS", "GridCell", "expand_layouts", "grid_cells", "paper_datasets",
           "parse_policy", "run_grid"]
