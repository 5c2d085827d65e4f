"""The in-memory session ledger: sessions by id, hash-keyed branches indexed by what D holds.

A hash-keyed request (no conversation_id) continues the session whose held fingerprint is a
prefix of it. Held fingerprints are indexed by digest, and each opening keeps the set of held
lengths its branches have, so a request hashes its own prefixes at those lengths and looks each
digest up: the work does not depend on how many conversations share an opening (a fixed
system prompt plus "Hi" is common), and the longest match wins.

An explicit conversation_id reused with a different opening (another user picking the same id,
or a client that restarts its numbering) gets its own session, `ID~<opening>`, so neither
destroys the other.

Writes are compare-and-set: a turn records itself only if its session still has the turn count
and held digest the turn read (`Version`); the loser of two concurrent turns stays unrecorded,
as an incomplete reply does. The ledger is bounded by an idle TTL (since the last recorded turn)
and a max count, least recently written first. It serves as `MemoryStore` and as the Redis
store's local cache.
"""

from __future__ import annotations

import secrets
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from proxy.sessions.session import Held, Lookup, Session, Transcript, Version, explicit_key

# The proxy's --session-ttl and --max-sessions defaults: an hour idle, 100k sessions.
DEFAULT_SESSION_TTL_S = 3600.0
DEFAULT_MAX_SESSIONS = 100_000


def new_session(transcript: Transcript, explicit_id: str | None, now: float,
                home: Session | None = None) -> Session:
    """A session not stored yet; a new hash-keyed branch starts on the nodes of `home`, the
    latest branch of its opening, whose prefix caches already hold the shared opening."""
    if explicit_id is not None:
        return Session(explicit_id, transcript.opening, False, created=now)
    session_id = f"h-{transcript.opening[:12]}-{secrets.token_hex(4)}"
    return Session(session_id, transcript.opening, True, home.decode if home else None,
                   home.prefill if home else None, created=now)


class SessionLedger:
    """Sessions by id with a held-digest index; the clock is injected."""

    def __init__(self, ttl: float, max_sessions: int, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._max = max_sessions
        self._clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._held: dict[str, str] = {}  # held digest -> hash-keyed session id
        self._lengths: dict[str, Counter[int]] = {}  # opening -> its branches' held lengths
        self._home: dict[str, str] = {}  # opening -> its latest hash-keyed session

    def __len__(self) -> int:
        self._expire(self._clock())
        return len(self._sessions)

    def get(self, session_id: str) -> Session | None:
        """A live session by id, without touching it."""
        self._expire(self._clock())
        return self._sessions.get(session_id)

    def resolve(self, transcript: Transcript, explicit_id: str | None = None) -> Lookup:
        """The session a request belongs to (a copy to work on) and whether it continues it."""
        now = self._clock()
        self._expire(now)
        if explicit_id is not None:
            stored = self._sessions.get(explicit_id)
            if stored is not None and stored.opening != transcript.opening:
                explicit_id = explicit_key(explicit_id, transcript.opening)
                stored = self._sessions.get(explicit_id)
            if stored is None:
                return Lookup(new_session(transcript, explicit_id, now), False)
            return Lookup(replace(stored), transcript.continues(stored.held),
                          Version.of(stored))
        lengths = self._lengths.get(transcript.opening)
        if lengths:
            matches = transcript.prefix_digests(lengths)
            for digest in sorted(matches, key=matches.__getitem__, reverse=True):
                if (session_id := self._held.get(digest)) is not None:
                    stored = self._sessions[session_id]
                    return Lookup(replace(stored), True, Version.of(stored))
        home = self._sessions.get(self._home.get(transcript.opening, ""))
        return Lookup(new_session(transcript, None, now, home), False)

    def record_turn(self, lookup: Lookup, held: Held | None) -> Session | None:
        """A turn completed: store its session with D holding `held`, unless another turn of
        the session was recorded since this one read it (then None: the turn is unrecorded)."""
        now = self._clock()
        self._expire(now)
        stored = self._sessions.get(lookup.session.id)
        if (Version.of(stored) if stored is not None else None) != lookup.version:
            return None
        session = lookup.recorded(held, now)
        self.put(session)
        return session

    def put(self, session: Session) -> None:
        """Store a session as it is (replacing any with its id) and index what its D holds."""
        self.forget(session.id)
        self._sessions[session.id] = session
        if session.hashed and session.held is not None:
            self._held[session.held.digest] = session.id
            self._lengths.setdefault(session.opening, Counter())[session.held.length] += 1
            self._home[session.opening] = session.id
        while len(self._sessions) > self._max:
            self._drop(next(iter(self._sessions)))

    def forget(self, session_id: str) -> None:
        """Drop a session (if held) and its index entries."""
        if session_id in self._sessions:
            self._drop(session_id)

    def snapshot(self) -> list[dict[str, Any]]:
        """Every live session as plain data (for the admin /sessions endpoint)."""
        self._expire(self._clock())
        return [s.as_dict() for s in self._sessions.values()]

    def _drop(self, session_id: str) -> None:
        session = self._sessions.pop(session_id)
        held = session.held
        if session.hashed and held is not None:
            if self._held.get(held.digest) == session_id:
                del self._held[held.digest]
            lengths = self._lengths[session.opening]
            lengths[held.length] -= 1
            if lengths[held.length] <= 0:
                del lengths[held.length]
            if not lengths:
                del self._lengths[session.opening]
            if self._home.get(session.opening) == session_id:
                del self._home[session.opening]

    def _expire(self, now: float) -> None:
        # Sessions sit in write order, so the expired ones are all at the front.
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if oldest.last_access + self._ttl > now:
                break
            self._drop(oldest.id)
