"""`ppd profile --backend sim`: the profiler's grid, measured on the simulator.

The same cells, the same forced routes (turn 2+ `pd`, then `local`, with `--readback` also
`readback`: the simulated Ds keep a turn's blocks for it), the same turn-2
statistics (`profiler.profile.runner.turn2_stats`, `cell_row`) and the same table files
(`profiler.tables.io.write_table`) as a profile of a real cluster, so the proxy loads the
result like any table; meta.json says `simulated` with the cost preset and link. A qps point
is requests (turns) per second, as in a real profile: two-turn conversations start at qps/2.

Each (cell, route) is a fresh simulated cluster, so there is nothing to warm up and one
route never sees the other's caches; both routes replay the same conversations.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from profiler.profile.runner import (
    PROFILED_ROUTES,
    TURNS_PER_CONVERSATION,
    WITH_READBACK,
    ProfileGrid,
    cell_row,
    turn2_stats,
)
from profiler.simulator.run import RunSpec, simulate
from profiler.tables.io import build_meta, write_table
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.readback.protocol import VLLM_DECODER_BLOCKS_TTL_S
from proxy.shared.discretize import Cell
from proxy.shared.tokens import TOKEN_DEFINITION
from proxy.shared.vocabulary import RouteKind


def _spec(base: RunSpec, cell: Cell, route: RouteKind) -> RunSpec:
    return replace(base, dataset=f"synthetic:{cell.context_class}-{cell.workload}",
                   qps=cell.qps / TURNS_PER_CONVERSATION, max_turns=TURNS_PER_CONVERSATION,
                   forced_route=route)


def measure_cell(args: tuple[RunSpec, Cell, tuple[RouteKind, ...]]) -> dict[str, Any]:
    """The routes of one cell -> the table row (what a worker process returns)."""
    base, cell, routes = args
    return cell_row(cell, {route: turn2_stats(simulate(_spec(base, cell, route)).records, route)
                           for route in routes})


def profile_sim(grid: ProfileGrid, *, layout: str, cost: str, out_csv: Path, seed: int = 0,
                link: str = "nvlink", model: str | None = None, processes: int = 1,
                command: str | None = None, weights: dict[str, float] | None = None,
                routes: tuple[RouteKind, ...] = PROFILED_ROUTES) -> list[dict[str, Any]]:
    """Profile every cell of grid on a simulated cluster; write the table; return its rows."""
    base = RunSpec(layout=layout, dataset="synthetic:small-tiny", qps=1.0,
                   # Forced routes override the policy; it decides only whether D keeps
                   # blocks (a policy that reads back: readback) - needed for the readback.
                   policy=PolicyConfig(kind=Policy.READBACK if RouteKind.READBACK in routes
                                       else Policy.PD),
                   cost=cost, model=model, link=link,
                   duration_s=grid.duration_s, timeout_s=grid.timeout_s, seed=seed,
                   # D keeps blocks only when the readback is profiled: a real profile
                   # (`--cluster`) turns it on only then, so a pd/local table is the same.
                   kv_readback_ttl_s=(VLLM_DECODER_BLOCKS_TTL_S
                                      if RouteKind.READBACK in routes else None))
    cells = grid.cells()
    rows = _measure_all(base, cells, processes, routes)
    meta = build_meta(
        model=base.model_name, layout=layout,
        backend=f"simulated: ppd engine model, cost preset {cost}, link {link}",
        grid=grid.as_meta(), weights=weights or {"w_ttft": 1.0, "w_tpot": 1.0},
        extra={"simulated": True, "cost": cost, "link": link, "seed": seed,
               "token_definition": TOKEN_DEFINITION,
               "hardware": f"simulated ({cost})",
               "qps_unit": "requests (conversation turns) per second; 2-turn conversations "
                           "arriving at qps/2 per second",
               **({"command": command} if command else {})})
    write_table(rows, out_csv, meta)
    return rows


def _measure_all(base: RunSpec, cells: Sequence[Cell], processes: int,
                 routes: tuple[RouteKind, ...]) -> list[dict[str, Any]]:
    if processes <= 1:
        rows = []
        for index, cell in enumerate(cells, start=1):
            rows.append(measure_cell((base, cell, routes)))
            print(f"\r  profiled {index}/{len(cells)} cells", end="", file=sys.stderr)
        print(file=sys.stderr)
        return rows
    return _pool_map(base, cells, processes, routes)


def _pool_map(base: RunSpec, cells: Sequence[Cell], processes: int,
              routes: tuple[RouteKind, ...]) -> list[dict[str, Any]]:
    import multiprocessing

    # As the grid: fork, the cost preset loaded in each worker, heaviest cells first.
    context = multiprocessing.get_context("fork")
    heavy_first = sorted(range(len(cells)), key=lambda i: -cells[i].qps)
    rows: list[dict[str, Any] | None] = [None] * len(cells)
    with context.Pool(processes) as pool:
        results = pool.imap(measure_cell, [(base, cells[i], routes) for i in heavy_first])
        for index, row in zip(heavy_first, results, strict=True):
            rows[index] = row
    return [row for row in rows if row is not None]




def profile_from_args(args: Any, grid: ProfileGrid, command: str) -> Any:
    """`ppd profile --backend sim ...`: the table as the profiler's normalized frame."""
    from profiler.tables.io import normalize

    if not args.layout:
        raise ValueError("--backend sim needs --layout (e.g. 1P3D)")
    rows = profile_sim(grid, layout=args.layout, cost=args.cost, out_csv=args.out,
                       seed=args.seed, model=None if args.model is None else args.model,
                       processes=args.processes,
                       command=command,
                       weights={"w_ttft": args.w_ttft, "w_tpot": args.w_tpot},
                       routes=WITH_READBACK if args.readback else PROFILED_ROUTES)
    return normalize(rows)
