"""The one token definition shared by the proxy, the profiler and the synthetic workloads.

A decision-table cell only means the same thing to the side that measures it (the profiler,
whose synthetic turns have exactly n_in tokens) and the side that looks it up (the router) if
both count the same way. `TOKEN_DEFINITION` names that way; the table's meta records it
(docs/architecture.md, "Token definition").

text-v1:
- n_in, a turn's new input: the tokens of the text the turn adds beyond what D holds - chat: the
  `content` text of the messages after the held ones; completions: the prompt's new suffix (a
  token-id prompt counts its ids) - as plain text, no chat template, no special tokens. A
  template rendered over a fragment of a conversation does not count what the fragment adds
  (many templates insert a default system prompt or a BOS when the first message is not a
  system one), and the few role-marker tokens per message are a constant the table absorbs.
- n_out: the request's `max_completion_tokens` / `max_tokens`; without one, the caller's
  running estimate.
- n_ctx, the context D holds after a turn: vLLM's usage, prompt + completion tokens (the served
  model's own count, template included), minus the reasoning tokens, which the next turn's
  history does not carry (proxy.shared.completion). Without usage: the turn's n_ctx + n_in + the
  reply.

Counters: `HFTokenCounter` reads a local Hugging Face `tokenizer.json` through the `tokenizers`
package (exact for the served model, no hub access); `EstimateTokenCounter` is ceil(chars / 4)
when none is given. Both can also cut a text to a token count, which is how synthetic prompts
reach an exact n_in.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from proxy.shared.completion import Captured

TOKEN_DEFINITION = "text-v1"
CHARS_PER_TOKEN = 4


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the tokens of a text as the served model's tokenizer would (no special tokens)."""

    name: str

    def count(self, text: str) -> int:
        """Tokens of text."""
        ...

    def truncate(self, text: str, n_tokens: int) -> str:
        """A prefix of text with at most n_tokens tokens (as close to n_tokens as possible)."""
        ...


class TokenizerError(ValueError):
    """A tokenizer directory cannot be used; the message says why."""


class EstimateTokenCounter:
    """ceil(characters / 4): the usual rule of thumb when the model's tokenizer is not at hand."""

    name = "approx-4-chars"

    def count(self, text: str) -> int:
        """Estimated tokens of a text (0 for an empty one)."""
        return math.ceil(len(text) / CHARS_PER_TOKEN)

    def truncate(self, text: str, n_tokens: int) -> str:
        """The first 4 * n_tokens characters."""
        return text[: max(n_tokens, 0) * CHARS_PER_TOKEN]


class HFTokenCounter:
    """Exact counts from a local HF tokenizer: a model directory or its tokenizer.json."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer  # here: commands that count nothing do not load it

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise TokenizerError(f"no tokenizer.json in {path} (give a model directory)")
        try:
            self._tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # the Rust library raises plain Exception subclasses
            raise TokenizerError(f"cannot load {file}: {exc}") from exc
        self.name = str(path)

    def count(self, text: str) -> int:
        """Exact tokens of a text, without added special tokens."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def truncate(self, text: str, n_tokens: int) -> str:
        """The text decoded from its first n_tokens tokens (the text itself if shorter)."""
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) <= n_tokens:
            return text
        return str(self._tokenizer.decode(ids[: max(n_tokens, 0)], skip_special_tokens=True))


def token_counter(path: str | Path | None) -> TokenCounter:
    """The counter for a tokenizer directory (or tokenizer.json), or the estimate without one."""
    return EstimateTokenCounter() if path is None else HFTokenCounter(path)


def content_text(content: Any) -> str:
    """The text of a chat message's content: a string, text parts joined, or nothing."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content
                       if isinstance(part, dict) and isinstance(part.get("text"), str))
    return "" if content is None else json.dumps(content)


def new_input_tokens(counter: TokenCounter, body: Mapping[str, Any], held_length: int, *,
                     chat: bool) -> int:
    """n_in of a chat or completions request whose first held_length units D holds (messages,
    characters or token ids)."""
    if chat:
        return sum(counter.count(content_text(message.get("content")))
                   for message in body["messages"][held_length:])
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return counter.count(prompt[held_length:])
    # A list prompt is token ids (one token each; D holds the first held_length) or a batch of
    # texts (it never continues: held_length is 0).
    return sum(counter.count(item) if isinstance(item, str) else 1
               for item in prompt[held_length:])


def requested_output_tokens(body: Mapping[str, Any]) -> int | None:
    """n_out a request asks for (`max_completion_tokens`, else `max_tokens`), None if neither."""
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    return min(int(limit), MAX_TOKEN_COUNT) if limit else None


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """A finished turn in tokens: what it generated, and the context D holds after it."""

    completion_tokens: int
    held_tokens: int


# The most tokens one usage field may report: far beyond any context (vLLM's longest are
# ~10M tokens). A larger count, a negative one or a float is not a count: the field reads as
# missing and the turn's tokens are counted instead (10^308 once poisoned the running mean).
MAX_TOKEN_COUNT = 2**31


def _int_field(mapping: Any, *keys: str) -> int | None:
    for key in keys:
        mapping = mapping.get(key) if isinstance(mapping, dict) else None
    return (mapping if isinstance(mapping, int) and not isinstance(mapping, bool)
            and 0 <= mapping <= MAX_TOKEN_COUNT else None)


def turn_usage(counter: TokenCounter, captured: Captured, prompt_estimate: int) -> TurnUsage:
    """The turn's usage by vLLM's report, counted with counter where the report is missing.

    prompt_estimate: the turn's n_ctx + n_in, used when the reply carried no usage.
    """
    usage = captured.usage or {}
    completion = _int_field(usage, "completion_tokens")
    if completion is None:
        completion = counter.count(captured.text) + counter.count(captured.reasoning)
    prompt = _int_field(usage, "prompt_tokens")
    if prompt is None:
        prompt = prompt_estimate
    reasoning = _int_field(usage, "completion_tokens_details", "reasoning_tokens")
    if reasoning is None:
        reasoning = counter.count(captured.reasoning) if captured.reasoning else 0
    return TurnUsage(completion, prompt + max(completion - reasoning, 0))

