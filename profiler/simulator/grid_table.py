"""Reading a `ppd sim grid` table for `ppd sim paper`: each file checked where it is read,
so a damaged or hand-edited grid is refused in words naming the file, not later by pandas or
matplotlib in their own terms (a KeyError, a plot's layout error)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from profiler.tables.io import read_csv_file

# What a grid row holds that the tables read (grid.py writes it): the run's names and
# numbers, whose values together say which run it is (seed: when the grid has it), and metrics.
NAME_COLUMNS = ("layout", "dataset", "policy")
KEY_NUMBERS = ("qps", "seed")
RUN_KEY = ("layout", "dataset", "qps", "policy", "seed")
METRICS = ("turn2plus_ttft_ms_mean", "tpot_ms_mean", "output_tok_s", "success_rate",
           "local_share", "kv_bytes_moved")
# The replay's summary leaves out what no request measured: success_rate in a run that made
# no request, local_share in one where no turn 2+ carried a route (replica runs): these may be
# missing anywhere. The other metrics only in a run that lost requests (all those of a turn,
# say); a run that lost none has them all, so a gap there is an edited or damaged grid.
METRICS_MAY_BE_MISSING = ("success_rate", "local_share")


def load_grids(paths: Sequence[Path]) -> pd.DataFrame:
    """The grid tables read as one, each checked (`check_grid`); a run in two of them is an
    error too, since the tables would count it twice."""
    frame = pd.concat([load_grid(path) for path in paths], ignore_index=True)
    if len(paths) > 1:
        _check_unique_runs(frame, " + ".join(map(str, paths)))
    return frame


def load_grid(path: Path) -> pd.DataFrame:
    """A `ppd sim grid` table, checked (`check_grid`) before any table is computed from it."""
    if not path.is_file():
        raise ValueError(f"grid table not found: {path} (write one with `ppd sim grid`)")
    frame = _read_grid(path)
    check_grid(frame, str(path))
    return _with_numbers(frame)


def _read_grid(path: Path) -> pd.DataFrame:
    what = "a grid table (`ppd sim grid --out` writes one)"
    if path.suffix != ".parquet":
        return read_csv_file(path, what)
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"{path} is not a readable Parquet file ({exc}): it should be "
                         f"{what}") from None


def check_grid(frame: pd.DataFrame, source: str) -> None:
    """Raise one ValueError that names `source` and says what is wrong, unless the frame is a
    grid the tables can be computed from: the columns they read, at least one run, each run
    named (layout, dataset, policy) and placed (qps, seed) once, metrics that are numbers,
    finite, and missing only where a run leaves them so (`METRICS_MAY_BE_MISSING`).

    Checked here, where a grid is read, because pandas and matplotlib report a bad value
    much later and in their own terms (a KeyError, a plot's layout error)."""
    lacking = [column for column in (*NAME_COLUMNS, "qps", *METRICS) if column not in frame]
    if lacking:
        raise ValueError(f"{source} is not a ppd sim grid table: it lacks the column(s) "
                         f"{', '.join(lacking)} (`ppd sim grid` writes them)")
    if frame.empty:
        raise ValueError(f"{source} holds no runs (a header row only): `ppd sim grid` writes "
                         "a row per run")
    problems = [*_name_problems(frame), *_number_problems(frame)]
    if problems:
        raise ValueError(f"{source} has values the tables cannot use: {'; '.join(problems)}")
    _check_unique_runs(frame, source)


def _name_problems(frame: pd.DataFrame) -> list[str]:
    problems = []
    for column in NAME_COLUMNS:
        unnamed = ~frame[column].map(lambda value: isinstance(value, str) and bool(value.strip()))
        if unnamed.any():
            problems.append(f"{column}: {_rows(unnamed.sum())} without a name")
    return problems


def _number_problems(frame: pd.DataFrame) -> list[str]:
    success = _numbers(frame["success_rate"])
    lost_requests = ~(success >= 1.0)  # NaN too: a run that made no request measured nothing
    problems = []
    for column in (*KEY_NUMBERS, *METRICS):
        if column not in frame:
            continue  # seed: a grid of one seed may leave it out
        values = frame[column]
        numbers = _numbers(values)
        text = values.notna() & numbers.isna()
        if text.any():
            example = values[text].iloc[0]
            problems.append(f"{column}: {_rows(text.sum())} not a number (e.g. {example!r})")
        infinite = numbers.isin([math.inf, -math.inf])
        if infinite.any():
            problems.append(f"{column}: {_rows(infinite.sum())} infinite")
        missing = values.isna() & ~_may_miss(column, lost_requests)
        if missing.any():
            where = "" if column in KEY_NUMBERS else " in runs that lost no request"
            problems.append(f"{column}: {_rows(missing.sum())} missing{where}")
    return problems


def _may_miss(column: str, lost_requests: pd.Series) -> pd.Series:
    """Where a column may be empty (see METRICS_MAY_BE_MISSING); a run's qps and seed, never."""
    if column in KEY_NUMBERS or column in METRICS_MAY_BE_MISSING:
        return pd.Series(column in METRICS_MAY_BE_MISSING, index=lost_requests.index)
    return lost_requests


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _numbers(values: pd.Series) -> pd.Series:
    """The column as numbers, NaN where a value is missing or not a number. Text that spells
    a number counts as one: one cell of text makes pandas read a whole CSV column as text."""
    return pd.to_numeric(values, errors="coerce")


def _with_numbers(frame: pd.DataFrame) -> pd.DataFrame:
    """The checked grid with its number columns read as text (see `_numbers`) as numbers."""
    columns = [column for column in (*KEY_NUMBERS, *METRICS)
               if column in frame and not pd.api.types.is_numeric_dtype(frame[column])]
    return frame.assign(**{column: pd.to_numeric(frame[column]) for column in columns})


def _rows(count: int) -> str:
    return f"{count} row" if count == 1 else f"{count} rows"


def _check_unique_runs(frame: pd.DataFrame, source: str) -> None:
    key = [column for column in RUN_KEY if column in frame]
    repeated = frame.duplicated(subset=key, keep=False)
    if not repeated.any():
        return
    first = frame[repeated].iloc[0]
    named = ", ".join(f"{column} {_plain(first[column])}" for column in key)
    copies = int((frame[key] == first[key]).all(axis=1).sum())
    raise ValueError(f"{source} holds a run more than once (e.g. {named}, in {copies} rows): "
                     "each run must appear once - the same grid may have been given twice "
                     "(another setup's grid goes after --ideal)")


def _plain(value: Any) -> str:
    return f"{value:g}" if _is_number(value) else str(value)
