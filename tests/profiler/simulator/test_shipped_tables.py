"""The shipped H100 tables: they load, say they are simulated, and a cell re-measures equal."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from profiler.profile.on_simulator import measure_cell
from profiler.profile.runner import PROFILED_ROUTES, ProfileGrid
from profiler.simulator.run import RunSpec
from proxy.policies.table import DecisionTable
from proxy.shared.discretize import Cell, ContextClass

TABLES = Path(__file__).resolve().parents[3] / "tables"
LAYOUTS = ("1p3d", "2p2d", "3p1d")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shipped_table_loads_and_records_its_rebuild_command(layout: str) -> None:
    table = DecisionTable.load(TABLES / f"h100-llama-3.1-8b-{layout}.csv")
    assert len(table) == 270  # 3 contexts x 9 shapes x 10 qps points
    # the default preset: aiconfigurator's kernels plus vLLM 0.24's host side (real H100 fit)
    assert table.meta["simulated"] is True
    assert table.meta["cost"] == "h100:llama-3.1-8b"
    assert f"--cost {table.meta['cost']} " in table.meta["command"]
    assert table.meta["layout"].lower() == layout
    assert f"--backend sim --layout {layout.upper()}" in table.meta["command"]
    assert "--contexts small,large,huge" in table.meta["command"]
    assert table.meta["grid"]["contexts"] == ["small", "large", "huge"]
    # Both routes measured in every cell (a route that failed every turn would be NaN), but
    # in huge/very_long_gen at 20 requests/s and more, where the 9k-token contexts swamp the
    # D nodes and a route (3P1D: both) can time out on every turn 2 (tables/README.md).
    unmeasured = [row.cell for row in table.rows()
                  if not (math.isfinite(row.pd_ttft_ms) and math.isfinite(row.local_ttft_ms))]
    assert all(cell.context_class is ContextClass.HUGE and cell.workload == "very_long_gen"
               and cell.qps >= 20 for cell in unmeasured)


def test_a_shipped_cell_is_measured_again_to_the_same_numbers() -> None:
    # Determinism end to end: the simulator, seeded as the table's command, gives the same
    # row (the cheapest cell, so the test stays fast).
    table = DecisionTable.load(TABLES / "h100-llama-3.1-8b-1p3d.csv")
    cell = Cell(ContextClass.SMALL, "tiny", 1.0)
    shipped = table.row(cell)
    assert shipped is not None
    grid = ProfileGrid(duration_s=table.meta["grid"]["duration_s"],
                       timeout_s=table.meta["grid"]["timeout_s"])
    base = RunSpec(layout="1P3D", dataset="synthetic:small-tiny", qps=1.0,
                   cost=table.meta["cost"], duration_s=grid.duration_s,
                   timeout_s=grid.timeout_s, seed=table.meta["seed"])
    row = measure_cell((base, cell, PROFILED_ROUTES))
    for column in ("pd_ttft_ms", "pd_tpot_ms", "local_ttft_ms", "local_tpot_ms"):
        assert math.isclose(row[column], getattr(shipped, column), rel_tol=1e-9), column
