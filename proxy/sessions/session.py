"""Sessions: which conversation a request continues, and what its D already holds.

A session is found by an explicit id (`conversation_id` body field or `x-session-id` header)
or, failing that, by a hash of the conversation's opening (chat: system prompt + first user
message; completions: the prompt up to its first turn separator, or its first
`OPENING_TOKENS` token ids). It remembers its D and P, its
turn count, last access, and `Held`: a fingerprint of the exact text D holds in its prefix cache
(the last prompt plus the reply the proxy streamed back) with its token count.

A request is a *continuation* iff it strictly extends that text (chat: its messages start with
the previous messages + `proxy.shared.completion.assistant_message(reply)`, compared by role and
text
only, the reasoning of a reasoning model not included; completions: its prompt starts with the
previous prompt + reply; a prompt of token ids: it strictly extends the previous prompt's ids;
docs/architecture.md, "Session tracking"). A request that extends
no text a D holds (edited history, another user whose first message is the same) is a new
branch and counts as turn 1. Sessions live in namespaces (the opening, with the explicit id
if any), so two users with the same opening each continue their own conversation, and nothing
but a session's own next turn replaces it (`proxy.sessions.ledger`: the index and the forks).

This module is the vocabulary (transcripts, fingerprints, sessions, lookups). Where sessions
live is `proxy.sessions.store` (in memory by default, `proxy.sessions.redis_store` for several
processes); the in-memory one, the session ledger, is `proxy.sessions.ledger`. They only keep
books: which route a turn takes is the policies' business.
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.shared.completion import assistant_message

# Completions fallback key: the prompt's opening ends after the first of these separators ...
TURN_SEPARATORS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "</s>", "\n")
# ... or after this many characters when the prompt has none.
OPENING_MAX_CHARS = 64
# A prompt of token ids opens with this many ids: about as much as 64 characters of text, and
# shorter than a templated one-line first turn (a chat template's headers alone are ~10-30
# ids), so every later turn shares its first turn's opening; a first turn shorter than this
# is its own opening and its next turn is not found (as with a short string prompt). More
# would not sort better: the ledger's work does not grow with a namespace's sessions, and a
# shared system prompt is longer than any opening anyway.
OPENING_TOKENS = 16


def _digest(data: bytes | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _message_text(content: Any) -> str:
    """The text of a message's content (string, list of parts, or null) for fingerprinting."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"] if isinstance(part, dict) and isinstance(part.get("text"), str)
            else json.dumps(part, sort_keys=True)
            for part in content
        )
    return json.dumps(content, sort_keys=True)


def _canonical_message(message: dict[str, Any]) -> bytes:
    # Role and text only: a client that echoes the assistant message back with extra fields
    # (name, refusal: null, ...) still continues its conversation. orjson: the standard
    # library's encoder was 4% of the proxy's CPU per 4-turn request (benchmarks/
    # proxy_overhead); it stays for what orjson refuses (a lone surrogate in an upstream's
    # reply), and either way a message always encodes to the same bytes.
    pair = [message.get("role"), _message_text(message.get("content"))]
    try:
        return orjson.dumps(pair) + b"\n"
    except TypeError:
        return json.dumps(pair).encode() + b"\n"


@dataclass(frozen=True, slots=True)
class Held:
    """What D holds for a session: its length (messages or characters), digest and tokens."""

    length: int
    digest: str
    tokens: int


class Transcript:
    """A request's conversation as the ledger sees it: a sequence of units with prefix digests.

    Chat: the units are messages (role + text). Completions with a string prompt: characters;
    with a prompt of token ids: tokens. A batch (a list of strings or of id lists) is several
    conversations at once, so it never continues a session (every such request is turn 1).
    """

    def __init__(self, opening: str, length: int, extendable: bool) -> None:
        self.opening = opening
        self.length = length
        self.extendable = extendable

    @staticmethod
    def from_chat(messages: Sequence[dict[str, Any]]) -> ChatTranscript:
        """The transcript of a chat request."""
        return ChatTranscript(messages)

    @staticmethod
    def from_prompt(prompt: str | list[Any]) -> Transcript:
        """The transcript of a completions request."""
        if isinstance(prompt, str):
            return PromptTranscript(prompt)
        if (token_ids := _token_array(prompt)) is not None:
            return TokenTranscript(token_ids)
        return Transcript(_digest(json.dumps(prompt).encode()), len(prompt), extendable=False)

    def prefix_digest(self, length: int) -> str | None:
        """Digest of the first `length` units (None when not extendable)."""
        return None

    def prefix_digests(self, lengths: Iterable[int]) -> dict[str, int]:
        """Digest -> length for each of `lengths` shorter than this transcript: the held
        fingerprints this request would continue (empty when not extendable)."""
        if not self.extendable:
            return {}
        out: dict[str, int] = {}
        for length in lengths:
            if 0 < length < self.length and (digest := self.prefix_digest(length)) is not None:
                out[digest] = length
        return out

    def held_after(self, reply: str, tokens: int) -> Held | None:
        """What D holds once it has answered this request with `reply`."""
        return None

    def continues(self, held: Held | None) -> bool:
        """True iff this request strictly extends the text D holds."""
        return (held is not None and self.extendable and held.length < self.length
                and self.prefix_digest(held.length) == held.digest)

    def one_turn_after(self, held: Held) -> bool:
        """Whether what follows `held` holds no reply, so no later turn can have been recorded
        (a session cache may answer without asking the store). Unknown for plain prompts."""
        return True


class ChatTranscript(Transcript):
    """A chat request: messages, with the digest of every prefix computed once."""

    def __init__(self, messages: Sequence[dict[str, Any]]) -> None:
        self.messages = messages
        hasher = hashlib.blake2b(digest_size=16)
        self._prefix: list[str] = [hasher.copy().hexdigest()]
        opening_end = None
        for i, message in enumerate(messages):
            hasher.update(_canonical_message(message))
            self._prefix.append(hasher.copy().hexdigest())
            if opening_end is None and message.get("role") == "user":
                opening_end = i + 1
        self._hasher = hasher
        super().__init__(self._prefix[opening_end or len(messages)], len(messages), True)

    def prefix_digest(self, length: int) -> str | None:
        return self._prefix[length] if 0 <= length < len(self._prefix) else None

    def one_turn_after(self, held: Held) -> bool:
        return all(m.get("role") != "assistant" for m in self.messages[held.length:])

    def held_after(self, reply: str, tokens: int) -> Held:
        hasher = self._hasher.copy()
        hasher.update(_canonical_message(assistant_message(reply)))
        return Held(self.length + 1, hasher.hexdigest(), tokens)


class PromptTranscript(Transcript):
    """A completions request with a string prompt; units are characters."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt
        ends = [i + len(sep) for sep in TURN_SEPARATORS if (i := prompt.find(sep)) >= 0]
        opening = prompt[: min(ends)] if ends else prompt[:OPENING_MAX_CHARS]
        super().__init__(_digest(opening.encode()), len(prompt), True)

    def prefix_digest(self, length: int) -> str | None:
        return _digest(self.prompt[:length].encode()) if length <= self.length else None

    def prefix_digests(self, lengths: Iterable[int]) -> dict[str, int]:
        # One pass over the prompt for all lengths (a popular opening may have many branches).
        hasher = hashlib.blake2b(digest_size=16)
        out: dict[str, int] = {}
        done = 0
        for length in sorted({n for n in lengths if 0 < n < self.length}):
            hasher.update(self.prompt[done:length].encode())
            done = length
            out[hasher.copy().hexdigest()] = length
        return out

    def held_after(self, reply: str, tokens: int) -> Held:
        text = self.prompt + reply
        return Held(len(text), _digest(text.encode()), tokens)


def _token_array(prompt: list[Any]) -> array[int] | None:
    """A prompt of token ids as little-endian int64s (the same bytes on every machine sharing
    a session store), or None if it is not one: empty, a batch, a bool, an id beyond int64."""
    if not prompt or not all(type(item) is int for item in prompt):
        return None
    try:
        ids = array("q", prompt)
    except OverflowError:
        return None  # no vocabulary is that large; the engine will refuse it
    if sys.byteorder == "big":
        ids.byteswap()
    return ids


class TokenTranscript(Transcript):
    """A completions request whose prompt is a flat list of token ids; units are tokens.

    What D holds after a turn is known only as this prompt's ids: the reply comes back as
    text, whose ids the proxy does not know. A client that sends them back (the prompt, the
    reply's ids from vLLM's `return_token_ids`, then the new message's) or a replay that
    builds each turn on its parent's ids continues; held tokens are the prompt's length, as
    only those are checked to lead the next prompt.
    """

    def __init__(self, token_ids: array[int]) -> None:
        self._bytes = memoryview(token_ids).cast("B")
        self._width = token_ids.itemsize
        # Tagged: a string prompt of the same bytes opens another namespace.
        opening = _digest(b"tokens\x00" + self._bytes[:OPENING_TOKENS * self._width])
        super().__init__(opening, len(token_ids), True)

    def prefix_digest(self, length: int) -> str | None:
        if not 0 <= length <= self.length:
            return None
        return _digest(self._bytes[:length * self._width])

    def prefix_digests(self, lengths: Iterable[int]) -> dict[str, int]:
        # One pass over the ids for all lengths, as PromptTranscript.
        hasher = hashlib.blake2b(digest_size=16)
        out: dict[str, int] = {}
        done = 0
        for length in sorted({n for n in lengths if 0 < n < self.length}):
            hasher.update(self._bytes[done * self._width:length * self._width])
            done = length
            out[hasher.copy().hexdigest()] = length
        return out

    def held_after(self, reply: str, tokens: int) -> Held:
        # Not `tokens` (vLLM's prompt + completion): the next prompt is checked to start with
        # this prompt only, so that is all the next turn may count as D's (its n_ctx).
        return Held(self.length, _digest(self._bytes), self.length)


@dataclass(slots=True, eq=False)
class Session:
    """One conversation branch: its home nodes, turns served, and what its D holds."""

    id: str
    opening: str  # its namespace: the opening's digest (with the explicit id, if any)
    hashed: bool  # no explicit id: the client is told this id (else its own)
    decode: str | None = None
    prefill: str | None = None
    turns: int = 0
    last_access: float = 0.0
    held: Held | None = None
    created: float = field(default=0.0)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (for the admin /sessions endpoint)."""
        return {"id": self.id, "decode": self.decode, "prefill": self.prefill,
                "turns": self.turns, "held_tokens": self.held.tokens if self.held else 0,
                "last_access": self.last_access}


@dataclass(frozen=True, slots=True)
class Version:
    """What a stored session looked like when a turn read it: its turn count and held digest.
    A turn's write succeeds only if the session still looks like this (compare-and-set)."""

    turns: int
    digest: str | None

    @staticmethod
    def of(session: Session) -> Version:
        """The version of a stored session."""
        return Version(session.turns, session.held.digest if session.held else None)


@dataclass(frozen=True, slots=True)
class Lookup:
    """The store's answer for one request: a working copy of its session, whether the request
    continues it, and the version read (None: the session is new, not stored yet)."""

    session: Session
    continuation: bool
    version: Version | None = None

    @property
    def turn(self) -> int:
        """1-based turn index of this request (1 = new conversation or new branch)."""
        return self.session.turns + 1 if self.continuation else 1

    @property
    def cached_tokens(self) -> int:
        """Tokens D already holds for this request (0 unless a continuation)."""
        held = self.session.held
        return held.tokens if self.continuation and held is not None else 0

    def recorded(self, held: Held | None, now: float) -> Session:
        """The session as stored once this turn completed with D holding `held`."""
        s = self.session
        return Session(s.id, s.opening, s.hashed, s.decode, s.prefill, self.turn, now, held,
                       s.created or now)


def namespace(transcript: Transcript, explicit_id: str | None) -> str:
    """Where a request's sessions live: its opening's digest, or, under an explicit id, a
    digest of the id and the opening (an id reused with another opening is another
    namespace, and an id never meets a hash-keyed conversation)."""
    if explicit_id is None:
        return transcript.opening
    return _digest(b"id\x00" + explicit_id.encode("utf-8", "surrogatepass") + b"\x00"
                   + transcript.opening.encode())
