"""Decision tables (docs/architecture.md, "Table format"): raw measurements of the routes.

One row per cell (context_class, workload, qps) with TABLE_COLUMNS, and optionally
READBACK_COLUMNS (`ppd profile --readback`: the third route, docs/readback.md). The verdict is
computed here, never stored, so operators can change weights without re-profiling. Each route
is scored against P->D:

    delta_ttft = (pd_ttft - route_ttft) / pd_ttft     (> 0: the route's first token is sooner)
    delta_tpot = (route_tpot - pd_tpot) / pd_tpot     (> 0: the route decodes slower)
    score      = w_ttft * delta_ttft - w_tpot * delta_tpot

and the cell goes to the route of the highest score, P->D when none is above 0 (a tie keeps
the earlier of pd, local, readback: the one that needs less cached state). Readback is a
candidate only where the caller says the turn can read back (`decide(..., routes=...)`).

Success-rate guard first: a route whose success rate is below the best candidate's by more
than `success_margin` loses the cell whatever its latencies.

Strict rows: a row missing a value (empty, NaN, or a CSV line cut short) is an error naming
the row, since a half-written row would otherwise steer traffic silently. A cell left
unmeasured on purpose says so in the optional `status` column (`unmeasured`; the profiler
writes it for a route that produced no latency): its missing route is decided for the other
route, and with neither route measured the cell counts as missing.

CSV needs only the csv module; Parquet imports pyarrow lazily. `NAME.meta.json` beside the
table is read if present; it is informative (a model mismatch is a warning, not an error), except
for its `token_definition` (proxy.shared.tokens), which must be this proxy's.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.shared.discretize import WORKLOAD_SHAPES, Cell, ContextClass, nearest_qps
from proxy.shared.tokens import TOKEN_DEFINITION
from proxy.shared.vocabulary import RouteKind

TABLE_COLUMNS: tuple[str, ...] = (
    "context_class", "workload", "qps",
    "pd_ttft_ms", "pd_tpot_ms", "pd_success",
    "local_ttft_ms", "local_tpot_ms", "local_success",
    "n_requests",
)
# The third route's columns, optional: a table without them (or a cell with them empty) has
# no readback verdict, and such a cell is decided between pd and local.
READBACK_COLUMNS: tuple[str, ...] = ("readback_ttft_ms", "readback_tpot_ms", "readback_success")
# A route whose success rate trails the best one's by more than this loses the cell.
DEFAULT_SUCCESS_MARGIN = 0.05
_MEASURES = ("pd_ttft_ms", "pd_tpot_ms", "pd_success", "local_ttft_ms", "local_tpot_ms",
             "local_success")
_SUCCESS_COLUMNS = ("pd_success", "local_success", "readback_success")
# The routes a table can measure, in the order a tie is broken (less cached state first).
TABLE_ROUTES: tuple[RouteKind, ...] = (RouteKind.PD, RouteKind.LOCAL, RouteKind.READBACK)
TWO_ROUTES: tuple[RouteKind, ...] = (RouteKind.PD, RouteKind.LOCAL)
# Optional column: `measured` (or empty) / `unmeasured` (missing values allowed on purpose).
STATUS_COLUMN = "status"
MEASURED, UNMEASURED = "measured", "unmeasured"


class TableError(ValueError):
    """A decision table cannot be loaded; the message names the file, row and column."""


@dataclass(frozen=True, slots=True)
class TableRow:
    """The measurements of the routes in one cell (readback's NaN where it was not profiled)."""

    cell: Cell
    pd_ttft_ms: float
    pd_tpot_ms: float
    pd_success: float
    local_ttft_ms: float
    local_tpot_ms: float
    local_success: float
    n_requests: int
    readback_ttft_ms: float = math.nan
    readback_tpot_ms: float = math.nan
    readback_success: float = math.nan

    def measured(self, route: RouteKind) -> bool:
        """Whether the cell holds a latency of both kinds for the route."""
        ttft, tpot = getattr(self, f"{route}_ttft_ms"), getattr(self, f"{route}_tpot_ms")
        return math.isfinite(ttft) and math.isfinite(tpot) and ttft > 0 and tpot > 0

    def _success(self, route: RouteKind) -> float:
        # A measured route with no success value counts as fully successful.
        success = getattr(self, f"{route}_success")
        return success if math.isfinite(success) else 1.0

    def score(self, w_ttft: float, w_tpot: float, route: RouteKind = RouteKind.LOCAL,
              reference: RouteKind = RouteKind.PD) -> float:
        """The module docstring's score of `route` against `reference` (> 0 favours `route`);
        NaN when either is unmeasured."""
        if not (self.measured(reference) and self.measured(route)):
            return math.nan
        ref_ttft, ref_tpot = (getattr(self, f"{reference}_ttft_ms"),
                              getattr(self, f"{reference}_tpot_ms"))
        delta_ttft = (ref_ttft - getattr(self, f"{route}_ttft_ms")) / ref_ttft
        delta_tpot = (getattr(self, f"{route}_tpot_ms") - ref_tpot) / ref_tpot
        return w_ttft * delta_ttft - w_tpot * delta_tpot

    def decide(self, w_ttft: float, w_tpot: float, success_margin: float,
               routes: tuple[RouteKind, ...] = TWO_ROUTES) -> RouteKind | None:
        """The route this cell calls for under the given weights, among `routes` (in
        TABLE_ROUTES' order); None: none of them measured."""
        candidates = [r for r in TABLE_ROUTES if r in routes and self.measured(r)]
        if not candidates:
            return None
        best_success = max(self._success(r) for r in candidates)
        candidates = [r for r in candidates if self._success(r) >= best_success - success_margin]
        # Scores are against P->D (or the first candidate when pd went unmeasured).
        chosen, chosen_score = candidates[0], 0.0
        for route in candidates[1:]:
            score = self.score(w_ttft, w_tpot, route, reference=candidates[0])
            if score > chosen_score:
                chosen, chosen_score = route, score
        return chosen


def _number(raw: Any, column: str, where: str) -> float:
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        return math.nan
    try:
        return float(raw)
    except (TypeError, ValueError):
        raise TableError(f"{where}: column {column!r} is not a number: {raw!r}") from None


def _parse_row(raw: Mapping[str, Any], where: str) -> TableRow:
    missing = [c for c in TABLE_COLUMNS if c not in raw]
    if missing:
        raise TableError(f"{where}: missing columns {missing} (need {list(TABLE_COLUMNS)})")
    try:
        context = ContextClass(str(raw["context_class"]).strip())
    except ValueError:
        raise TableError(f"{where}: unknown context_class {raw['context_class']!r} "
                         f"(one of {[c.value for c in ContextClass]})") from None
    workload = str(raw["workload"]).strip()
    if workload not in WORKLOAD_SHAPES:
        raise TableError(f"{where}: unknown workload {workload!r} "
                         f"(one of {list(WORKLOAD_SHAPES)})")
    qps = _number(raw["qps"], "qps", where)
    if not math.isfinite(qps) or qps < 0:
        raise TableError(f"{where}: qps must be a number >= 0, got {raw['qps']!r}")
    values = {c: _number(raw[c], c, where) for c in _MEASURES}
    extra = {c: _number(raw.get(c), c, where) for c in READBACK_COLUMNS if c in raw}
    for column in _SUCCESS_COLUMNS:
        value = values.get(column, extra.get(column, math.nan))
        if math.isfinite(value) and not (0.0 <= value <= 1.0):
            raise TableError(f"{where}: {column} must be a fraction in [0, 1]")
    n_requests = _number(raw["n_requests"], "n_requests", where)
    status = str(raw.get(STATUS_COLUMN) or MEASURED).strip().lower() or MEASURED
    if status in ("nan", "none"):
        status = MEASURED
    if status not in (MEASURED, UNMEASURED):
        raise TableError(f"{where}: status must be {MEASURED!r} or {UNMEASURED!r}, "
                         f"got {raw.get(STATUS_COLUMN)!r}")
    numbers = {**values, "n_requests": n_requests}
    empty = [column for column, value in numbers.items() if not math.isfinite(value)]
    if empty and status != UNMEASURED:
        raise TableError(f"{where} (cell {context.value}/{workload}/qps={qps:g}): no value for "
                         f"{empty}; complete the row, or mark it status={UNMEASURED} if the "
                         "cell was left unmeasured on purpose")
    return TableRow(Cell(context, workload, qps), **values,
                    n_requests=int(n_requests) if math.isfinite(n_requests) else 0, **extra)


class DecisionTable:
    """Rows by cell, with O(1) lookups; decisions computed from the raw measurements."""

    def __init__(self, rows: Iterable[TableRow], meta: dict[str, Any] | None = None,
                 source: str = "<rows>") -> None:
        self._rows: dict[Cell, TableRow] = {}
        for row in rows:
            if row.cell in self._rows:
                raise TableError(f"{source}: duplicate cell {tuple(row.cell)}")
            self._rows[row.cell] = row
        if not self._rows:
            raise TableError(f"{source}: the table has no rows")
        self.qps_points: tuple[float, ...] = tuple(sorted({c.qps for c in self._rows}))
        self.meta: dict[str, Any] = meta or {}
        self.source = source
        # Whether any cell measured the third route (`ppd profile --readback`).
        self.has_readback = any(row.measured(RouteKind.READBACK) for row in self._rows.values())

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], source: str = "<rows>",
                  meta: dict[str, Any] | None = None) -> DecisionTable:
        """A table from dicts keyed by TABLE_COLUMNS (values as strings or numbers)."""
        return cls((_parse_row(r, f"{source} row {i + 1}") for i, r in enumerate(rows)),
                   meta=meta, source=source)

    @classmethod
    def load(cls, path: Path | str) -> DecisionTable:
        """Load a CSV or Parquet table and its NAME.meta.json when present."""
        path = Path(path)
        if not path.is_file():
            raise TableError(f"decision table not found: {path}")
        if path.suffix == ".parquet":
            try:
                import pyarrow.parquet as pq  # lazy: only Parquet tables need it
            except ImportError:
                raise TableError(f"{path}: reading Parquet tables needs pyarrow "
                                 "(pip install pyarrow), or use the CSV table") from None
            rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
        else:
            with path.open(newline="") as handle:
                reader = csv.DictReader(handle)
                missing = [c for c in TABLE_COLUMNS if c not in (reader.fieldnames or [])]
                if missing:
                    raise TableError(f"{path}: missing columns {missing} "
                                     f"(need {list(TABLE_COLUMNS)})")
                rows = list(reader)
        return cls.from_rows(rows, source=str(path), meta=cls._load_meta(path))

    @staticmethod
    def _load_meta(path: Path) -> dict[str, Any]:
        meta_path = path.with_name(f"{path.stem}.meta.json")
        if not meta_path.is_file():
            return {}
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError as exc:
            raise TableError(f"{meta_path} is not valid JSON: {exc}") from exc
        meta = meta if isinstance(meta, dict) else {}
        counted = meta.get("token_definition", TOKEN_DEFINITION)
        if counted != TOKEN_DEFINITION:
            # Its cells hold turns counted another way: every lookup would land off by some.
            raise TableError(f"{path} was profiled with token definition {counted!r}; this "
                             f"proxy counts tokens as {TOKEN_DEFINITION!r}: re-profile it")
        return meta

    def __len__(self) -> int:
        return len(self._rows)

    def rows(self) -> list[TableRow]:
        """All rows, in load order."""
        return list(self._rows.values())

    def row(self, cell: Cell) -> TableRow | None:
        """The row of a cell, or None."""
        return self._rows.get(cell)

    def nearest_qps(self, qps: float) -> float:
        """The profiled load point nearest to qps."""
        return nearest_qps(qps, self.qps_points)

    def score(self, cell: Cell, w_ttft: float, w_tpot: float) -> float | None:
        """The score of a cell (None when the cell is missing; NaN when unmeasured)."""
        row = self._rows.get(cell)
        return None if row is None else row.score(w_ttft, w_tpot)

    def decide(self, cell: Cell, w_ttft: float, w_tpot: float,
               success_margin: float = DEFAULT_SUCCESS_MARGIN,
               routes: tuple[RouteKind, ...] = TWO_ROUTES) -> RouteKind | None:
        """The route for a cell, or None when the table has no verdict for it."""
        row = self._rows.get(cell)
        return None if row is None else row.decide(w_ttft, w_tpot, success_margin, routes)

    def decisions(self, w_ttft: float, w_tpot: float,
                  success_margin: float = DEFAULT_SUCCESS_MARGIN,
                  routes: tuple[RouteKind, ...] = TWO_ROUTES) -> dict[Cell, RouteKind]:
        """Every cell's verdict among `routes`, computed once (the proxy does this at start-up)."""
        out = {}
        for cell, row in self._rows.items():
            verdict = row.decide(w_ttft, w_tpot, success_margin, routes)
            if verdict is not None:
                out[cell] = verdict
        return out

    def model_warning(self, served_model: str | None) -> str | None:
        """A warning when the table was profiled on another model than the one served."""
        profiled = self.meta.get("model")
        if profiled and served_model and profiled != served_model:
            return (f"decision table {self.source} was profiled on model {profiled!r}, "
                    f"the backends serve {served_model!r}")
        return None
