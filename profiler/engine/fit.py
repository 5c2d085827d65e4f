"""`ppd sim fit`: a `LinearCost` preset fitted to a real cluster's replay runs.

From the per-request rows of one or more runs (requests.csv or .parquet, as `ppd replay`
writes them):
- prefill: turn-1 TTFT (the whole prompt is computed) against prompt tokens gives
  `per_prefill_token_ms`; rows whose prefill overlapped no other prompt's are used when
  there are enough of them, so queueing does not steepen the slope;
- decode: TPOT, less the prompt chunks that ran beside it (prompts whose first token came
  while it decoded, at the prefill slope), against the number of requests decoding at the
  same time (from the rows' own [first token, end] intervals) gives
  `base_ms + per_decode_seq_ms * batch`.
On a P/D run a turn-1 TTFT also holds the P->D hand-off: its per-token part lands in the
prefill slope and its constant part in the intercept, which is reported but not put in the
step cost (the transfer model owns it). Fit a replica run (`--policy replica`) for a pure
engine cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from profiler.engine.cost import LinearCost

MIN_ROWS = 3
QUIET_ROWS = 5  # enough unqueued turn-1 rows to fit the prefill slope on them alone


@dataclass(frozen=True, slots=True)
class Fit:
    cost: LinearCost
    ttft_intercept_ms: float
    n_prefill_rows: int
    n_decode_rows: int
    prefill_rows_unqueued: bool


def read_runs(paths: Sequence[Path]) -> pd.DataFrame:
    """Rows of every run (a run directory or its requests.csv / requests.parquet), each file
    checked before any fit: a bad file is one ValueError naming it and the column."""
    frames = [_read_requests(_requests_file(path)) for path in paths]
    if not frames:
        raise ValueError("give at least one replay run")
    return pd.concat(frames, ignore_index=True)


def read_frame(path: Path) -> pd.DataFrame:
    """A CSV (or .parquet) file as a frame; an empty or unparsable file is a ValueError that
    names it, not pandas' own words."""
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path}: the file is empty") from None
    except pd.errors.ParserError as error:
        raise ValueError(f"{path}: not a CSV file ({error})") from None


def numeric_column(frame: pd.DataFrame, column: str, path: Path, *,
                   allow_empty: bool = True, allow_negative: bool = False) -> pd.Series:
    """frame[column] as floats, or a ValueError naming the file, the column, how many rows
    are bad and the first bad value: text, infinities, negative values (unless allowed) and
    empty cells (unless allowed: a failed request has no TTFT)."""
    raw = frame[column]
    values = pd.to_numeric(raw, errors="coerce").astype(float)
    problems = [(raw.notna() & values.isna(), "not a number")]
    if not allow_empty:
        problems.append((raw.isna(), "empty (or NaN)"))
    problems.append((np.isinf(values), "infinite"))
    if not allow_negative:
        problems.append((values < 0, "negative"))
    for bad, what in problems:
        if bad.any():
            raise ValueError(f"{path}: column {column}: {int(bad.sum())} row(s) {what}"
                             + _first_value(raw[bad]))
    return values


def _first_value(bad: pd.Series) -> str:
    first = bad.iloc[0]
    if pd.isna(first):
        return ""  # an empty cell has nothing to show
    return f" (first: {first!r})" if isinstance(first, str) else f" (first: {first})"


_TIMES = ("start", "ttft", "tpot", "e2e")  # `*_ms` in files `ppd replay` writes
_COUNTS = ("turn", "n_input_tokens", "n_output_tokens")


def _requests_file(path: Path) -> Path:
    if path.is_dir():
        path = path / "requests.parquet" if (path / "requests.parquet").is_file() \
            else path / "requests.csv"
    if not path.is_file():
        raise ValueError(f"no requests.csv or requests.parquet at {path}")
    return path


def _read_requests(path: Path) -> pd.DataFrame:
    frame = read_frame(path)
    # A time is missing only when neither spelling is there; named as `ppd replay` writes it.
    missing = [f"{name}_ms" for name in _TIMES
               if f"{name}_ms" not in frame.columns and f"{name}_s" not in frame.columns]
    missing += [name for name in (*_COUNTS, "success") if name not in frame.columns]
    if missing:
        raise ValueError(f"{path}: not a replay requests file (missing column(s) {missing})")
    for name in _TIMES:
        column = f"{name}_ms" if f"{name}_ms" in frame.columns else f"{name}_s"
        # start is an offset in the run, the others latencies: only those cannot be < 0
        frame[column] = numeric_column(frame, column, path, allow_negative=name == "start")
    for column in _COUNTS:
        frame[column] = numeric_column(frame, column, path)
    return _in_seconds(frame)


def _in_seconds(frame: pd.DataFrame) -> pd.DataFrame:
    """Replay runs write times in ms (`*_ms`); runs made before that wrote seconds (`*_s`)."""
    for name in ("start", "ttft", "tpot", "e2e"):
        if f"{name}_ms" in frame.columns and f"{name}_s" not in frame.columns:
            frame[f"{name}_s"] = frame[f"{name}_ms"] / 1000.0
    return frame


def fit(rows: pd.DataFrame, name: str, source: str) -> Fit:
    ok = rows[rows["success"].astype(bool) & rows["ttft_s"].notna()].copy()
    ok["first_s"] = ok["start_s"] + ok["ttft_s"]
    ok["end_s"] = ok["start_s"] + ok["e2e_s"]
    starts, firsts, ends = (ok[c].to_numpy(float) for c in ("start_s", "first_s", "end_s"))

    turn1 = ok[(ok["turn"] == 1) & ok["n_input_tokens"].notna()]
    # Prompts that overlapped another prompt's prefill queued or shared steps with it.
    overlapping = np.array([int(((starts < first) & (firsts > start)).sum()) for start, first
                            in zip(turn1["start_s"], turn1["first_s"], strict=True)])
    quiet = turn1[overlapping <= 1]
    use_quiet = len(quiet) >= QUIET_ROWS
    prefill = quiet if use_quiet else turn1
    intercept_ms, per_token_ms = _line(prefill["n_input_tokens"].to_numpy(float),
                                       prefill["ttft_s"].to_numpy(float) * 1000,
                                       "prefill (turn-1 TTFT vs prompt tokens)")
    per_token_ms = max(per_token_ms, 0.0)

    # A decode step also carries the prompt chunks scheduled beside it: take out the prompt
    # tokens whose prefill ended while this request decoded before fitting the batch term.
    decoding = ok[ok["tpot_s"].notna() & (ok["n_output_tokens"] > 1)]
    prompt_tokens = ok["n_input_tokens"].fillna(0).to_numpy(float)
    batch, tpot_ms = [], []
    for first, end, tpot, n_out in zip(decoding["first_s"], decoding["end_s"],
                                       decoding["tpot_s"], decoding["n_output_tokens"],
                                       strict=True):
        batch.append(_mean_overlap(first, end, firsts, ends))
        mixed_in = prompt_tokens[(firsts > first) & (firsts <= end)].sum()
        tpot_ms.append(tpot * 1000 - per_token_ms * mixed_in / (n_out - 1))
    base_ms, per_seq_ms = _line(np.asarray(batch), np.asarray(tpot_ms),
                                "decode (TPOT vs concurrent decodes)")
    cost = LinearCost(name=name, source=source, base_ms=max(base_ms, 0.0),
                      per_prefill_token_ms=per_token_ms,
                      per_decode_seq_ms=max(per_seq_ms, 0.0))
    return Fit(cost, intercept_ms, len(prefill), len(decoding), use_quiet)


def _mean_overlap(first: float, end: float, firsts: np.ndarray, ends: np.ndarray) -> float:
    """Mean number of requests decoding during [first, end] (this one included)."""
    span = end - first
    if span <= 0:
        return 1.0
    overlap = np.clip(np.minimum(ends, end) - np.maximum(firsts, first), 0.0, None)
    return float(overlap.sum() / span)


def _line(x: np.ndarray, y: np.ndarray, what: str) -> tuple[float, float]:
    """Least-squares intercept and slope; a flat line when x does not vary."""
    if len(x) < MIN_ROWS:
        raise ValueError(f"{what}: {len(x)} usable rows, need at least {MIN_ROWS}")
    if np.ptp(x) == 0:
        return float(np.mean(y)), 0.0
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def write_preset(result: Fit, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(result.cost.to_json() + "\n")
