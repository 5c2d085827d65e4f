"""The supported trace formats: how to recognise a record, and its (role, text) messages.

| format   | record                                                                        |
|----------|-------------------------------------------------------------------------------|
| sharegpt | {"id", "conversations": [{"from": "human"|"gpt"|..., "value"}]}; split parts   |
|          | "abc_0", "abc_1", ... of one conversation are merged                          |
| wildchat | {"conversation_hash", "conversation": [{"role", "content"}], "language", ...} |
| lmsys    | {"conversation_id", "conversation": [{"role", "content"}], "language", ...}   |
| openai   | {"id", "messages": [{"role", "content"}]} (vLLM's multi-turn benchmark)      |
| mooncake | {"timestamp", "input_length", "output_length", "hash_ids"}: one request per   |
|          | record, no text (a timed block-hash trace: `profiler.traces.mooncake`)       |
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from profiler.traces.conversation import canonical_role
from profiler.traces.mooncake import EXPECTED_RECORD as MOONCAKE_RECORD
from profiler.traces.mooncake import is_timed_record
from profiler.traces.records import TraceFileError


class TraceFormat(enum.StrEnum):
    AUTO = "auto"
    SHAREGPT = "sharegpt"
    WILDCHAT = "wildchat"
    LMSYS = "lmsys"
    OPENAI = "openai"
    MOONCAKE = "mooncake"

    @property
    def timed(self) -> bool:
        """Requests with recorded arrivals and block hashes, not conversations of text."""
        return self is TraceFormat.MOONCAKE


EXPECTED_RECORD: dict[TraceFormat, str] = {
    TraceFormat.SHAREGPT: '{"id", "conversations": [{"from", "value"}]}',
    TraceFormat.WILDCHAT: '{"conversation_hash", "conversation": [{"role", "content"}]}',
    TraceFormat.LMSYS: '{"conversation_id", "conversation": [{"role", "content"}]}',
    TraceFormat.OPENAI: '{"id", "messages": [{"role", "content"}]}',
    TraceFormat.MOONCAKE: MOONCAKE_RECORD,
}

# Which key identifies each format (and must hold a list of messages).
_ID_KEY = {
    TraceFormat.SHAREGPT: "id",
    TraceFormat.WILDCHAT: "conversation_hash",
    TraceFormat.LMSYS: "conversation_id",
    TraceFormat.OPENAI: "id",
}
_MESSAGES_KEY = {
    TraceFormat.SHAREGPT: "conversations",
    TraceFormat.WILDCHAT: "conversation",
    TraceFormat.LMSYS: "conversation",
    TraceFormat.OPENAI: "messages",
}

_SPLIT_PART = re.compile(r"^(?P<base>.+)_(?P<part>\d+)$")


@dataclass(frozen=True, slots=True)
class RawConversation:
    """A record reduced to what the model needs: id, (canonical role, text) pairs, language."""

    id: str
    messages: tuple[tuple[str, str], ...]
    language: str | None


def detect_format(record: Mapping[str, Any]) -> TraceFormat:
    """The format a record belongs to, or TraceFileError naming every expected shape."""
    for fmt in (TraceFormat.SHAREGPT, TraceFormat.WILDCHAT, TraceFormat.LMSYS, TraceFormat.OPENAI):
        if _ID_KEY[fmt] in record and _MESSAGES_KEY[fmt] in record:
            return fmt
    if is_timed_record(record):
        return TraceFormat.MOONCAKE
    expected = "; ".join(f"{fmt}: {shape}" for fmt, shape in EXPECTED_RECORD.items())
    raise TraceFileError(
        f"unrecognised trace record with keys {sorted(record)[:8]}; expected one of: {expected}"
    )


def check_format(record: Mapping[str, Any], fmt: TraceFormat) -> None:
    """Raise TraceFileError when record is not of format fmt."""
    if fmt.timed:
        if not is_timed_record(record):
            raise TraceFileError(f"not a {fmt} file: expected records {EXPECTED_RECORD[fmt]}, "
                                 f"found keys {sorted(record)[:8]}")
        return
    if _ID_KEY[fmt] not in record or not isinstance(record.get(_MESSAGES_KEY[fmt]), list):
        raise TraceFileError(
            f"not a {fmt} file: expected records {EXPECTED_RECORD[fmt]}, "
            f"found keys {sorted(record)[:8]}"
        )


def _text(content: Any) -> str | None:
    """A message's text: a string, or the text parts of an OpenAI content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return None


def _messages(raw: Any, role_key: str, text_key: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list):
        return ()
    pairs = []
    for item in raw:
        if not isinstance(item, Mapping) or not isinstance(item.get(role_key), str):
            continue
        role, text = canonical_role(item[role_key]), _text(item.get(text_key))
        if role is not None and text is not None:
            pairs.append((role, text))
    return tuple(pairs)


def _language(record: Mapping[str, Any]) -> str | None:
    language = record.get("language")
    return language if isinstance(language, str) and language else None


def raw_conversations(
    records: Iterable[Mapping[str, Any]], fmt: TraceFormat
) -> Iterator[RawConversation]:
    """Records of format fmt as RawConversations (ShareGPT split parts merged, in first-seen
    order). Every record is checked, so a file that changes shape midway is an error."""
    if fmt is TraceFormat.SHAREGPT:
        yield from _merged_sharegpt(records)
        return
    role_key, text_key = "role", "content"
    for record in records:
        check_format(record, fmt)
        yield RawConversation(
            id=str(record[_ID_KEY[fmt]]),
            messages=_messages(record[_MESSAGES_KEY[fmt]], role_key, text_key),
            language=_language(record),
        )


def _merged_sharegpt(records: Iterable[Mapping[str, Any]]) -> Iterator[RawConversation]:
    # ShareGPT splits long conversations into parts "abc_0", "abc_1", ... (usually adjacent, but
    # nothing guarantees it), so parts are collected by base id before anything is yielded.
    merged: dict[str, list[tuple[int, tuple[tuple[str, str], ...]]]] = {}
    for record in records:
        check_format(record, TraceFormat.SHAREGPT)
        record_id = str(record["id"])
        match = _SPLIT_PART.match(record_id)
        base, part = (match["base"], int(match["part"])) if match else (record_id, 0)
        merged.setdefault(base, []).append(
            (part, _messages(record["conversations"], "from", "value"))
        )
    for base, parts in merged.items():
        parts.sort(key=lambda item: item[0])
        messages = tuple(message for _, part_messages in parts for message in part_messages)
        yield RawConversation(id=base, messages=messages, language=None)
