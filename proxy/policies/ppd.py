"""`--policy ppd --table PATH`: the decision table's verdict for the turn's cell.

A table profiled with the third route (`ppd profile --readback`) may send a turn to readback
in its cell, but only a turn whose D keeps blocks P can read back now; any other turn gets the
cell's verdict between pd and local. A cell the table lacks goes P->D, the route that needs
no cached state (reason MISSING_CELL, counted in metrics). The table's flags (`Flags`) and
its weights' label suffix (`ppd-wtpot3`) are shared with policy live, which takes the table
as its prior.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.live.predict import StepCosts
from proxy.policies.base import Inputs, Need, Needs, Turn, disaggregated_default
from proxy.policies.table import DEFAULT_SUCCESS_MARGIN, TABLE_ROUTES, DecisionTable, TableRow
from proxy.shared.discretize import classify
from proxy.shared.options import option
from proxy.shared.vocabulary import Decision, Reason, RouteCost, RouteKind, Workload

NAME = "ppd"
LABEL_HELP = f"{NAME}, {NAME}-wtpotW"


@dataclass(frozen=True)
class Flags:
    """The table and its weights (live's too: `proxy.policies.live.Flags` extends these)."""

    table: Path | None = option(None, "policy ppd: decision table (CSV or Parquet)",
                                metavar="PATH")
    w_ttft: float = option(1.0, "policies ppd and live: weight of the turn's TTFT change",
                           metavar="W")
    w_tpot: float = option(1.0, "policies ppd and live: weight of the TPOT change",
                           metavar="W")
    success_margin: float = option(
        DEFAULT_SUCCESS_MARGIN, "policy ppd: a route whose success rate trails the other's by "
        "more than M loses", metavar="M")


NEEDS = Needs(table=Need.REQUIRED, readback=True)  # a table's readback verdicts
# A report label: the name, then `-wtpotW` when only the TPOT weight differs from 1.
WEIGHTS_LABEL = r"(?:-wtpot(?P<tpot>[\d.]+))?$"
_LABEL = re.compile(rf"^{NAME}{WEIGHTS_LABEL}")


def table_path(config: Any) -> Path | None:
    """The decision table the configuration names (`--table`), whichever policy runs: the
    proxy loads it for any (its model warning), ppd and live decide with it."""
    path: Path | None = config.table
    return path


def check_flags(config: Any) -> None:
    """The table's weights and margin, whichever policy is chosen."""
    for name in ("w_ttft", "w_tpot"):
        value = getattr(config, name)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be a finite number >= 0")
    if not (0.0 <= config.success_margin <= 1.0):
        raise ValueError("success margin must be in [0, 1]")


def weights_label(config: Any) -> str:
    """`-wtpot3` (only TPOT's weight differs), `-w2:3`, or nothing at the default weights."""
    if (config.w_ttft, config.w_tpot) == (1.0, 1.0):
        return ""
    if config.w_ttft == 1.0:
        return f"-wtpot{config.w_tpot:g}"
    return f"-w{config.w_ttft:g}:{config.w_tpot:g}"


def label_weights(match: re.Match[str]) -> dict[str, Any]:
    """The flags a label's weight suffix stands for."""
    return {"w_tpot": float(match["tpot"]) if match["tpot"] else 1.0}


def needed_table(text: str, table: Callable[[], Path | None]) -> Path:
    """The grid's table for a label that needs one, or a clear error."""
    path = table()
    if path is None:
        raise ValueError(f"policy {text} needs a decision table (--table or --table-dir)")
    return path


def label(config: Any) -> str:
    return f"{NAME}{weights_label(config)}"


def parse_label(text: str, table: Callable[[], Path | None]) -> dict[str, Any] | None:
    match = _LABEL.match(text)
    if match is None:
        return None
    return {"table": needed_table(text, table), **label_weights(match)}


def describe(config: Any) -> str:
    return (f"table {config.table}, w_ttft={config.w_ttft:g}, w_tpot={config.w_tpot:g}, "
            f"success margin {config.success_margin:g}")


def inputs(config: Any, table: DecisionTable | None, costs: StepCosts | None) -> Inputs:
    """The table's verdicts per cell at the configured weights, computed once: between pd
    and local, and among all three routes when the table measured readback."""
    if table is None:
        return Inputs(config, costs=costs)
    weights = (config.w_ttft, config.w_tpot, config.success_margin)
    readback = (table.decisions(*weights, routes=TABLE_ROUTES) if table.has_readback
                else None)
    return Inputs(config, table, table.decisions(*weights), costs, readback)


def table_decision(workload: Workload, inputs: Inputs, can_readback: bool = False) -> Decision:
    """The table's verdict for the workload's cell (MISSING_CELL -> P->D); among all three
    routes when the turn can read back and the table measured readback."""
    assert inputs.table is not None and inputs.verdicts is not None
    cell = classify(workload.n_ctx, workload.n_in, workload.n_out, workload.qps,
                    inputs.table.qps_points)
    verdicts = inputs.verdicts
    if can_readback and inputs.readback_verdicts is not None:
        verdicts = inputs.readback_verdicts
    verdict = verdicts.get(cell)
    if verdict is None:
        return Decision(RouteKind.PD, Reason.MISSING_CELL, cell)
    return Decision(verdict, Reason.TABLE, cell, costs=_measured(inputs.table.row(cell)))


def _measured(row: TableRow | None) -> tuple[RouteCost, ...]:
    """What the table measured for each route of the cell (x-ppd-costs, `proxy.shared.explain`)."""
    if row is None:
        return ()
    return tuple(RouteCost(route, getattr(row, f"{route}_ttft_ms"),
                           getattr(row, f"{route}_tpot_ms"))
                 for route in TABLE_ROUTES if row.measured(route))


def decide(turn: Turn, inputs: Inputs) -> Decision:
    """The table's verdict for a turn that could run locally."""
    return (disaggregated_default(turn)
            or table_decision(turn.workload, inputs, turn.can_readback))
