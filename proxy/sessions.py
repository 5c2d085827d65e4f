"""The session ledger: which conversation a request continues, and what its D already holds.

A session is found by an explicit id (`conversation_id` body field or `x-session-id` header)
or, failing that, by a hash of the conversation's opening (chat: system prompt + first user
message; completions: the prompt up to its first turn separator). It remembers its D and P, its
turn count, last access, and `Held`: a fingerprint of the exact text D holds in its prefix cache
(the last prompt plus the reply the proxy streamed back) with its token count.

A request is a *continuation* iff it strictly extends that text (chat: its messages start with
the previous messages + `proxy.completion.assistant_message(reply)`, compared by role and text
only, the reasoning of a reasoning model not included; completions: its prompt starts with the
previous prompt + reply; docs/architecture.md, "Session tracking"). Anything else (edited
history, a retry, another user whose first message is the same) is a new branch and counts as
turn 1. Hash-keyed sessions keep one session per branch, so two users with the same opening
each continue their own conversation.

The ledger is bounded by an idle TTL and a max count (least recently used goes first). It only
keeps books: which route a turn takes is the policies' business.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.completion import assistant_message

# Hash-keyed branches examined per request; bounds the work a popular opening can cause.
MAX_BRANCH_CANDIDATES = 32
# Completions fallback key: the prompt's opening ends after the first of these separators ...
TURN_SEPARATORS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "</s>", "\n")
# ... or after this many characters when the prompt has none.
OPENING_MAX_CHARS = 64


def _digest(data: bytes) -> str:
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
    # (name, refusal: null, ...) still continues its conversation.
    return json.dumps([message.get("role"), _message_text(message.get("content"))]).encode() + b"\n"


@dataclass(frozen=True, slots=True)
class Held:
    """What D holds for a session: its length (messages or characters), digest and tokens."""

    length: int
    digest: str
    tokens: int


class Transcript:
    """A request's conversation as the ledger sees it: a sequence of units with prefix digests.

    Chat: the units are messages (role + text). Completions with a string prompt: characters.
    A list prompt (token ids or a batch) cannot be extended by a text reply, so it never
    continues a session (every such request is turn 1).
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
        return Transcript(_digest(json.dumps(prompt).encode()), len(prompt), extendable=False)

    def prefix_digest(self, length: int) -> str | None:
        """Digest of the first `length` units (None when not extendable)."""
        return None

    def held_after(self, reply: str, tokens: int) -> Held | None:
        """What D holds once it has answered this request with `reply`."""
        return None

    def continues(self, held: Held | None) -> bool:
        """True iff this request strictly extends the text D holds."""
        return (held is not None and self.extendable and held.length < self.length
                and self.prefix_digest(held.length) == held.digest)


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

    def held_after(self, reply: str, tokens: int) -> Held:
        text = self.prompt + reply
        return Held(len(text), _digest(text.encode()), tokens)


@dataclass(slots=True, eq=False)
class Session:
    """One conversation branch: its home nodes, turns served, and what its D holds."""

    id: str
    opening: str | None  # the hash key of a hash-keyed session; None for explicit ids
    decode: str | None = None
    prefill: str | None = None
    turns: int = 0
    last_access: float = 0.0
    held: Held | None = None
    created: float = field(default=0.0)


@dataclass(frozen=True, slots=True)
class Lookup:
    """The ledger's answer for one request: its session and whether it continues it."""

    session: Session
    continuation: bool

    @property
    def turn(self) -> int:
        """1-based turn index of this request (1 = new conversation or new branch)."""
        return self.session.turns + 1 if self.continuation else 1

    @property
    def cached_tokens(self) -> int:
        """Tokens D already holds for this request (0 unless a continuation)."""
        held = self.session.held
        return held.tokens if self.continuation and held is not None else 0


class SessionLedger:
    """Sessions by id, bounded by idle TTL and LRU count; the clock is injected."""

    def __init__(self, ttl: float, max_sessions: int, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._max = max_sessions
        self._clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._by_opening: dict[str, list[str]] = {}
        self._branches = 0

    def __len__(self) -> int:
        self._expire(self._clock())
        return len(self._sessions)

    def get(self, session_id: str) -> Session | None:
        """A live session by id, without touching it."""
        self._expire(self._clock())
        return self._sessions.get(session_id)

    def resolve(self, transcript: Transcript, explicit_id: str | None = None) -> Lookup:
        """Find (or open) the session a request belongs to and tell whether it continues it."""
        now = self._clock()
        self._expire(now)
        if explicit_id is not None:
            session = self._sessions.get(explicit_id)
            if session is None:
                session = self._add(Session(explicit_id, None, created=now))
            lookup = Lookup(session, transcript.continues(session.held))
        else:
            lookup = self._resolve_hashed(transcript, now)
        lookup.session.last_access = now
        self._sessions.move_to_end(lookup.session.id)
        self._evict_over_max()
        return lookup

    def _resolve_hashed(self, transcript: Transcript, now: float) -> Lookup:
        ids = self._by_opening.get(transcript.opening, [])
        siblings = [self._sessions[i] for i in ids[-MAX_BRANCH_CANDIDATES:]]
        matching = [s for s in siblings if transcript.continues(s.held)]
        if matching:
            return Lookup(max(matching, key=lambda s: s.held.length if s.held else 0), True)
        base = f"h-{transcript.opening[:16]}"
        if base not in self._sessions:
            return Lookup(self._add(Session(base, transcript.opening, created=now)), False)
        # A new branch of a known opening (edited history, or another user with the same
        # first message): its own session, starting on the sibling's nodes whose prefix
        # caches already hold the shared opening.
        self._branches += 1
        sibling = siblings[-1] if siblings else self._sessions[base]
        branch = Session(f"{base}-{self._branches}", transcript.opening, sibling.decode,
                         sibling.prefill, created=now)
        return Lookup(self._add(branch), False)

    def record_turn(self, lookup: Lookup, held: Held | None) -> None:
        """A turn completed: advance the turn count and remember what D now holds."""
        session = lookup.session
        session.turns = lookup.turn
        session.held = held
        session.last_access = self._clock()
        if session.id in self._sessions:
            self._sessions.move_to_end(session.id)

    def snapshot(self) -> list[dict[str, Any]]:
        """Every live session as plain data (for the admin /sessions endpoint)."""
        self._expire(self._clock())
        return [
            {"id": s.id, "decode": s.decode, "prefill": s.prefill, "turns": s.turns,
             "held_tokens": s.held.tokens if s.held else 0, "last_access": s.last_access}
            for s in self._sessions.values()
        ]

    def _add(self, session: Session) -> Session:
        self._sessions[session.id] = session
        if session.opening is not None:
            self._by_opening.setdefault(session.opening, []).append(session.id)
        return session

    def _drop_oldest(self) -> None:
        _, session = self._sessions.popitem(last=False)
        if session.opening is not None:
            ids = self._by_opening.get(session.opening, [])
            if session.id in ids:
                ids.remove(session.id)
            if not ids:
                self._by_opening.pop(session.opening, None)

    def _expire(self, now: float) -> None:
        # Sessions sit in last-access order, so the expired ones are all at the front.
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if oldest.last_access + self._ttl > now:
                break
            self._drop_oldest()

    def _evict_over_max(self) -> None:
        while len(self._sessions) > self._max:
            self._drop_oldest()
