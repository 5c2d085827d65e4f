"""Reading trace files record by record: a JSON list, JSONL, or Parquet.

Large files are streamed (ijson for JSON lists, line by line for JSONL, row batches for
Parquet). A JSON list or JSONL file cut off in the middle - the ShareGPT file shipped on PyPI is
one - yields its complete leading records and reports the cut through `ReadStats.truncated`
instead of failing; malformed content elsewhere is an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# How ijson words an input that ends before the document does.
_EOF_MARKERS = ("premature eof", "incomplete json")


class TraceFileError(ValueError):
    """A trace file that cannot be read as the expected format."""


@dataclass(slots=True)
class ReadStats:
    """What reading a file found besides its records (filled in while iterating)."""

    records: int = 0
    truncated: bool = False


def _first_char(path: Path) -> str:
    with path.open("rb") as handle:
        while chunk := handle.read(4096):
            stripped = chunk.lstrip()
            if stripped:
                return chr(stripped[0])
    return ""


def iter_records(path: Path, stats: ReadStats | None = None) -> Iterator[dict[str, Any]]:
    """Every record (a JSON object) of a trace file, in file order."""
    stats = stats if stats is not None else ReadStats()
    if not path.is_file():
        raise TraceFileError(f"trace file not found: {path}")
    if path.suffix == ".parquet":
        yield from _parquet_records(path, stats)
        return
    first = _first_char(path)
    if first == "[":
        yield from _json_list_records(path, stats)
    elif first == "{":
        yield from _jsonl_records(path, stats)
    elif first == "":
        raise TraceFileError(f"{path} is empty")
    else:
        raise TraceFileError(
            f"{path} is not a trace file: expected a JSON list, JSONL or Parquet "
            f"(first character {first!r})"
        )


def _json_list_records(path: Path, stats: ReadStats) -> Iterator[dict[str, Any]]:
    import ijson

    with path.open("rb") as handle:
        items = ijson.items(handle, "item", use_float=True)
        while True:
            try:
                item = next(items)
            except StopIteration:
                return
            except ijson.JSONError as exc:
                if any(marker in str(exc).lower() for marker in _EOF_MARKERS):
                    stats.truncated = True
                    return
                raise TraceFileError(
                    f"{path}: invalid JSON after record {stats.records}: {exc}"
                ) from None
            if not isinstance(item, dict):
                kind = type(item).__name__
                raise TraceFileError(f"{path}: expected a list of objects, found a {kind}")
            stats.records += 1
            yield item


def _jsonl_records(path: Path, stats: ReadStats) -> Iterator[dict[str, Any]]:
    with path.open("r", encoding="utf-8") as handle:
        pending_error: str | None = None
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            if pending_error is not None:  # a bad line that was not the last one
                raise TraceFileError(pending_error)
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                # Tolerated only as the file's cut-off last line; decided at the next line.
                pending_error = f"{path}:{number}: invalid JSON line ({exc.msg})"
                if number == 1:
                    raise TraceFileError(
                        f"{path}: not JSONL (expected one JSON object per line; "
                        f"line 1: {exc.msg}); a single JSON document must be a list"
                    ) from None
                continue
            if not isinstance(item, dict):
                raise TraceFileError(f"{path}:{number}: expected a JSON object per line")
            stats.records += 1
            yield item
        if pending_error is not None:
            stats.truncated = True


def _parquet_records(path: Path, stats: ReadStats) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a non-Parquet file
        raise TraceFileError(f"{path}: not a readable Parquet file ({exc})") from None
    for batch in parquet.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            stats.records += 1
            yield row
