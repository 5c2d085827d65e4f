"""Timed block-hash traces (Mooncake's format): records, conversations, and a time window.

A record is one request: `timestamp` (ms from the trace's start), `input_length`,
`output_length` and `hash_ids`, the prompt as one id per 512-token block (the last block may be
partial). Two requests share a block id iff they share that whole block *and everything before
it*: the ids are remapped prefix hashes, so equal leading ids mean an equal prefix.

The trace names no conversations. The rule this module uses to rebuild them:

    A request continues the latest earlier request whose *complete* blocks are the longest
    proper prefix of its own `hash_ids`, among earlier requests with at least two complete
    blocks. None such: it starts a conversation.

- *complete* blocks: a request's partial last block is never a parent's evidence, since the
  next turn's block at that index holds more text (the reply and the next message) and so
  has another hash.
- *at least two*: sharing only the first block is not a continuation. In Mooncake's
  conversation trace block 0 is one system prompt common to every request; counting it would
  make the latest request shorter than 1,024 tokens the parent of every later one. The shared
  first block still gives the prefix-cache hits it gives in production: prompts are token ids
  made from the hashes (`profiler.traces.block_tokens`), so equal ids are equal tokens.
- *latest*, in file order (timestamps ascending, ties in file order); *forks* are allowed:
  two requests may continue the same one (a regenerated or edited turn).
- The reply: the trace hashes prompts only, so a reply's tokens are never a shared block of
  the next turn's hashes (they lie in its first new block, whose hash is new). They count as
  the next turn's history in its *length*: a continuation's history is its parent's prompt
  plus reply, at most its own input (`TimedRequest.history_tokens`); its new tokens are the
  rest. The prefix caches see only what the hashes say is shared.

A window (`TraceWindow`) cuts a slice by trace seconds and scales time: a request continuing
one before the window starts its own conversation in it (its blocks are still the same
tokens, so a cache warmed inside the window can hold them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profiler.traces.records import ReadStats, TraceFileError, iter_records

BLOCK_TOKENS = 512  # tokens per hashed block in Mooncake's traces
MIN_PARENT_BLOCKS = 2  # a shared first block alone (a system prompt) is not a continuation
RECORD_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
EXPECTED_RECORD = ('{"timestamp": ms, "input_length", "output_length", '
                   '"hash_ids": [one id per 512-token block]}')


def is_timed_record(record: Mapping[str, Any]) -> bool:
    """Whether a record looks like a timed block-hash record (the keys; values are checked
    by `parse_record`)."""
    return "hash_ids" in record and "timestamp" in record


@dataclass(frozen=True, slots=True)
class BlockRecord:
    """One request of the trace, as recorded."""

    index: int  # 0-based position in the file
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    @property
    def complete_blocks(self) -> int:
        """How many of its blocks are whole (the last one may be partial)."""
        return min(self.input_length // BLOCK_TOKENS, len(self.hash_ids))


def _int_field(record: Mapping[str, Any], key: str, where: str, minimum: int) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceFileError(f"{where}: {key!r} must be an integer >= {minimum}, got {value!r}"
                             f" (expected records {EXPECTED_RECORD})")
    return value


def parse_record(record: Mapping[str, Any], index: int, source: str = "") -> BlockRecord:
    """A checked record, or a TraceFileError that names the file, the record and the field."""
    where = f"{source}: record {index + 1}" if source else f"record {index + 1}"
    missing = [key for key in RECORD_KEYS if key not in record]
    if missing:
        raise TraceFileError(f"{where}: not a block-hash record, missing {missing} (expected "
                             f"records {EXPECTED_RECORD})")
    timestamp = record["timestamp"]
    if (isinstance(timestamp, bool) or not isinstance(timestamp, int | float)
            or not math.isfinite(timestamp) or timestamp < 0):
        raise TraceFileError(f"{where}: 'timestamp' must be milliseconds >= 0, got {timestamp!r}")
    input_length = _int_field(record, "input_length", where, 1)
    output_length = _int_field(record, "output_length", where, 0)
    hash_ids = record["hash_ids"]
    if (not isinstance(hash_ids, list) or not hash_ids
            or not all(isinstance(h, int) and not isinstance(h, bool) for h in hash_ids)):
        raise TraceFileError(f"{where}: 'hash_ids' must be a non-empty list of integers")
    blocks = math.ceil(input_length / BLOCK_TOKENS)
    if len(hash_ids) != blocks:
        raise TraceFileError(f"{where}: {len(hash_ids)} hash_ids for input_length "
                             f"{input_length} ({blocks} blocks of {BLOCK_TOKENS} tokens)")
    return BlockRecord(index, float(timestamp), input_length, output_length, tuple(hash_ids))


def parse_records(records: Iterable[Mapping[str, Any]], source: str = ""
                  ) -> list[BlockRecord]:
    """Every record checked; timestamps must not go backwards (the rule reads file order as
    time order)."""
    parsed: list[BlockRecord] = []
    for index, record in enumerate(records):
        block_record = parse_record(record, index, source)
        if parsed and block_record.timestamp_ms < parsed[-1].timestamp_ms:
            raise TraceFileError(f"{source or 'trace'}: record {index + 1}: timestamp "
                                 f"{block_record.timestamp_ms:g} is before the previous "
                                 "record's; records must be in arrival order")
        parsed.append(block_record)
    return parsed


def parents(records: list[BlockRecord]) -> list[int | None]:
    """For each record, the index of the record it continues (the module's rule), or None.

    A trie of complete-block prefixes, each node labelled with the latest record whose complete
    blocks end there: one walk per record, O(total blocks)."""
    children: dict[tuple[int, int], int] = {}  # (node, block id) -> node; node 0 is the root
    latest: dict[int, int] = {}  # node -> latest record whose complete blocks end there
    out: list[int | None] = []
    for record in records:
        node, best = 0, None
        # proper prefix: a parent's complete blocks are fewer than this record's blocks
        for depth, block in enumerate(record.hash_ids[:-1], start=1):
            found = children.get((node, block))
            if found is None:
                break
            node = found
            if depth >= MIN_PARENT_BLOCKS and node in latest:
                best = latest[node]
        out.append(best)
        node = 0
        for block in record.hash_ids[:record.complete_blocks]:
            node = children.setdefault((node, block), len(children) + 1)
        if node:
            latest[node] = record.index
    return out


@dataclass(frozen=True, slots=True)
class TraceWindow:
    """A slice of the trace and its pace.

    start_s, duration_s: the slice, in trace seconds (duration None: to the end).
    time_scale: 2 replays twice as fast (arrival = trace seconds after start / 2).
    """

    start_s: float = 0.0
    duration_s: float | None = None
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise ValueError(f"--start must be >= 0 seconds, got {self.start_s:g}")
        if self.duration_s is not None and not (math.isfinite(self.duration_s)
                                                and self.duration_s > 0):
            raise ValueError(f"--duration must be > 0 seconds, got {self.duration_s:g}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"--time-scale must be > 0, got {self.time_scale:g}")

    def holds(self, timestamp_ms: float) -> bool:
        seconds = timestamp_ms / 1000
        end = math.inf if self.duration_s is None else self.start_s + self.duration_s
        return self.start_s <= seconds < end


@dataclass(frozen=True, slots=True)
class TimedRequest:
    """A request of the window: when it arrives, which conversation and turn it is.

    arrival_s: seconds from the window's start, time-scaled.
    conversation: `mooncake-N`, N the file index of the conversation's first request in the
        window; turn: 1 for it, parent's turn + 1 for a continuation.
    history_tokens: the parent's prompt + reply, at most this input (0 for a turn 1).
    """

    record: BlockRecord
    arrival_s: float
    conversation: str
    turn: int
    parent: int | None  # file index of the request it continues (None: turn 1)
    history_tokens: int

    @property
    def new_tokens(self) -> int:
        """Prompt tokens that are not the conversation's history (at least 1)."""
        return max(self.record.input_length - self.history_tokens, 1)


def timed_requests(records: list[BlockRecord], window: TraceWindow | None = None
                   ) -> list[TimedRequest]:
    """The window's requests in arrival order, conversations rebuilt on the whole trace and
    cut at the window's start."""
    window = window or TraceWindow()
    links = parents(records)
    inside: dict[int, TimedRequest] = {}
    out: list[TimedRequest] = []
    for record, parent in zip(records, links, strict=True):
        if not window.holds(record.timestamp_ms):
            continue
        at = (record.timestamp_ms / 1000 - window.start_s) / window.time_scale
        before = inside.get(parent) if parent is not None else None
        if before is None:
            request = TimedRequest(record, at, f"mooncake-{record.index}", 1, None, 0)
        else:
            prior = before.record
            history = min(record.input_length, prior.input_length + prior.output_length)
            request = TimedRequest(record, at, before.conversation, before.turn + 1,
                                   prior.index, history)
        inside[record.index] = request
        out.append(request)
    return out


def load_timed_trace(path: str | Path, window: TraceWindow | None = None
                     ) -> list[TimedRequest]:
    """A timed block-hash trace file's requests in the window (TraceFileError if malformed
    or if the window holds none)."""
    path = Path(path)
    stats = ReadStats()
    records = parse_records(iter_records(path, stats), str(path))
    if not records:
        raise TraceFileError(f"{path} holds no records")
    requests = timed_requests(records, window)
    if not requests:
        last = records[-1].timestamp_ms / 1000
        raise TraceFileError(f"{path}: no request in the window (the trace spans 0-{last:g} s; "
                             "see --start and --duration)")
    return requests
