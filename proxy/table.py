"""Decision tables (docs/architecture.md, "Table format"): raw measurements of both routes.

One row per cell (context_class, workload, qps) with TABLE_COLUMNS. The verdict is computed
here, never stored, so operators can change weights without re-profiling:

    delta_ttft = (pd_ttft - local_ttft) / pd_ttft     (> 0: local reaches the first token sooner)
    delta_tpot = (local_tpot - pd_tpot) / pd_tpot     (> 0: local decodes slower)
    score      = w_ttft * delta_ttft - w_tpot * delta_tpot;  local iff score > 0

Success-rate guard first: a route whose success rate is below the other's by more than
`success_margin` loses the cell whatever its latencies.

Strict rows: a row missing a value (empty, NaN, or a CSV line cut short) is an error naming
the row, since a half-written row would otherwise steer traffic silently. A cell left
unmeasured on purpose says so in the optional `status` column (`unmeasured`; the profiler
writes it for a route that produced no latency): its missing route is decided for the other
route, and with neither route measured the cell counts as missing.

CSV needs only the csv module; Parquet imports pyarrow lazily. `NAME.meta.json` beside the
table is read if present; it is informative (a model mismatch is a warning, not an error), except
for its `token_definition` (proxy.tokens), which must be this proxy's.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.discretize import WORKLOAD_SHAPES, Cell, ContextClass, nearest_qps
from proxy.tokens import TOKEN_DEFINITION
from proxy.vocabulary import RouteKind

TABLE_COLUMNS: tuple[str, ...] = (
    "context_class", "workload", "qps",
    "pd_ttft_ms", "pd_tpot_ms", "pd_success",
    "local_ttft_ms", "local_tpot_ms", "local_success",
    "n_requests",
)
# A route whose success rate trails the other's by more than this loses the cell.
DEFAULT_SUCCESS_MARGIN = 0.05
_MEASURES = ("pd_ttft_ms", "pd_tpot_ms", "pd_success", "local_ttft_ms", "local_tpot_ms",
             "local_success")
# Optional column: `measured` (or empty) / `unmeasured` (missing values allowed on purpose).
STATUS_COLUMN = "status"
MEASURED, UNMEASURED = "measured", "unmeasured"


class TableError(ValueError):
    """A decision table cannot be loaded; the message names the file, row and column."""


@dataclass(frozen=True, slots=True)
class TableRow:
    """The measurements of both routes in one cell."""

    cell: Cell
    pd_ttft_ms: float
    pd_tpot_ms: float
    pd_success: float
    local_ttft_ms: float
    local_tpot_ms: float
    local_success: float
    n_requests: int

    def _measured(self, route: RouteKind) -> bool:
        ttft, tpot = getattr(self, f"{route}_ttft_ms"), getattr(self, f"{route}_tpot_ms")
        return math.isfinite(ttft) and math.isfinite(tpot) and ttft > 0 and tpot > 0

    def score(self, w_ttft: float, w_tpot: float) -> float:
        """The score of the module docstring (> 0 favours local); NaN when a route is unmeasured."""
        if not (self._measured(RouteKind.PD) and self._measured(RouteKind.LOCAL)):
            return math.nan
        delta_ttft = (self.pd_ttft_ms - self.local_ttft_ms) / self.pd_ttft_ms
        delta_tpot = (self.local_tpot_ms - self.pd_tpot_ms) / self.pd_tpot_ms
        return w_ttft * delta_ttft - w_tpot * delta_tpot

    def decide(self, w_ttft: float, w_tpot: float, success_margin: float) -> RouteKind | None:
        """The route this cell calls for under the given weights (None: nothing measured)."""
        pd_ok, local_ok = self._measured(RouteKind.PD), self._measured(RouteKind.LOCAL)
        if not (pd_ok or local_ok):
            return None
        if not local_ok:
            return RouteKind.PD
        if not pd_ok:
            return RouteKind.LOCAL
        # A measured route with no success column counts as fully successful.
        pd_success = self.pd_success if math.isfinite(self.pd_success) else 1.0
        local_success = self.local_success if math.isfinite(self.local_success) else 1.0
        if local_success < pd_success - success_margin:
            return RouteKind.PD
        if pd_success < local_success - success_margin:
            return RouteKind.LOCAL
        return RouteKind.LOCAL if self.score(w_ttft, w_tpot) > 0 else RouteKind.PD


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
    for column in ("pd_success", "local_success"):
        if math.isfinite(values[column]) and not (0.0 <= values[column] <= 1.0):
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
                    n_requests=int(n_requests) if math.isfinite(n_requests) else 0)


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
               success_margin: float = DEFAULT_SUCCESS_MARGIN) -> RouteKind | None:
        """The route for a cell, or None when the table has no verdict for it."""
        row = self._rows.get(cell)
        return None if row is None else row.decide(w_ttft, w_tpot, success_margin)

    def decisions(self, w_ttft: float, w_tpot: float,
                  success_margin: float = DEFAULT_SUCCESS_MARGIN) -> dict[Cell, RouteKind]:
        """Every cell's verdict, computed once (the proxy does this at start-up)."""
        out = {}
        for cell, row in self._rows.items():
            verdict = row.decide(w_ttft, w_tpot, success_margin)
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
