"""The in-memory session ledger: sessions by id, found through an index of what their D holds.

Every session lives in a namespace: its opening's digest, or, under an explicit
conversation_id, a digest of the id and the opening (`sessions.namespace`). A request continues
the session of its namespace whose held text is the longest prefix of the request. Each
namespace keeps the set of held lengths its sessions have, so a request hashes its own prefixes
at those lengths and looks each digest up: the work does not depend on how many conversations
share an opening (a fixed system prompt plus "Hi" is common).

The index maps (namespace, held digest) to the session as it was when it recorded that text,
and keeps the entry after the session moved on: D still holds that text in its prefix cache.
So a request that extends it continues there even when the session it came from has since
grown another way - another conversation with the identical history (greedy decoding gives
many), or a retry of an earlier turn - as a new branch (a fork) that starts with the turn
count, nodes and held text of that point: sessions whose histories are identical are
interchangeable for KV purposes. A request that extends nothing held is a new branch at turn
1. Nothing replaces a session but its own next turn: under an explicit id, a history that does
not continue it (another user picking the same id, a forged reply) is a new branch beside it,
stored under `ID~<random>`, while the client still sees its own id (`x-ppd-session`), so a
reused id answers exactly like an unused one.

Writes are compare-and-set: a turn records itself only if its session still has the turn count
and held digest the turn read (`Version`); the loser of two concurrent turns stays unrecorded,
as an incomplete reply does (its text stays reachable through the index entry it extended).
The ledger is bounded by an idle TTL (since the last recorded turn) and a max count, least
recently written first; a dropped session takes its index entries along. It serves as
`MemoryStore` and as the Redis store's local cache.
"""

from __future__ import annotations

import secrets
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from proxy.sessions.session import Held, Lookup, Session, Transcript, Version, namespace

# The proxy's --session-ttl and --max-sessions defaults: an hour idle, 100k sessions.
DEFAULT_SESSION_TTL_S = 3600.0
DEFAULT_MAX_SESSIONS = 100_000

# The index keeps the last few texts each session recorded (a fork from further back is rare),
# so its size is at most this many entries per live session, however long conversations get.
POINTS_PER_SESSION = 8


def new_session(transcript: Transcript, explicit_id: str | None, now: float,
                home: Session | None = None, session_id: str | None = None) -> Session:
    """A session not stored yet, named session_id (default: the explicit id, else a new
    `h-...` id); a new hash-keyed branch starts on the nodes of `home`, the latest session of
    its namespace, whose prefix caches already hold the shared opening. A new branch under an
    explicit id does not: where it lands would tell a client that the id is in use."""
    if explicit_id is not None:
        home = None
    if session_id is None:
        session_id = (explicit_id if explicit_id is not None
                      else f"h-{transcript.opening[:12]}-{secrets.token_hex(4)}")
    return Session(session_id, namespace(transcript, explicit_id), explicit_id is None,
                   home.decode if home else None, home.prefill if home else None, created=now)


def fork(point: Session, session_id: str, now: float) -> Session:
    """A new branch that continues from `point`, a session as it was when it recorded what D
    holds (its turns, nodes and held text), under its own id."""
    return Session(session_id, point.opening, point.hashed, point.decode, point.prefill,
                   point.turns, now, point.held, now)


def branch_id(explicit_id: str | None, transcript: Transcript) -> str:
    """The id of a further branch: `ID~<random>` under an explicit id, else a new `h-...`."""
    if explicit_id is None:
        return f"h-{transcript.opening[:12]}-{secrets.token_hex(4)}"
    return f"{explicit_id}~{secrets.token_hex(4)}"


class SessionLedger:
    """Sessions by id with a held-digest index; the clock is injected."""

    def __init__(self, ttl: float, max_sessions: int, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._max = max_sessions
        self._clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        # (namespace, held digest) -> the session as it was when it recorded that text.
        self._held: dict[tuple[str, str], Session] = {}
        self._keys: dict[str, list[tuple[str, str]]] = {}  # session id -> index keys it wrote
        self._lengths: dict[str, Counter[int]] = {}  # namespace -> its index's held lengths
        self._home: dict[str, str] = {}  # namespace -> its latest session

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
        space = namespace(transcript, explicit_id)
        lengths = self._lengths.get(space)
        if lengths:
            matches = transcript.prefix_digests(lengths)
            for digest in sorted(matches, key=matches.__getitem__, reverse=True):
                if (point := self._held.get((space, digest))) is not None:
                    current = self._sessions.get(point.id)
                    if current is not None and current.held == point.held:
                        return Lookup(replace(current), True, Version.of(current))
                    return Lookup(fork(point, branch_id(explicit_id, transcript), now), True)
        home = self._sessions.get(self._home.get(space, ""))
        session_id = None
        if explicit_id is not None and explicit_id in self._sessions:
            session_id = branch_id(explicit_id, transcript)  # the id is taken: a branch
        return Lookup(new_session(transcript, explicit_id, now, home, session_id), False)

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
        """Store a session (replacing the one with its id) and index what its D holds; the
        index entries of its earlier turns stay (their text is still held)."""
        self._sessions.pop(session.id, None)
        self._sessions[session.id] = session
        self._home[session.opening] = session.id
        if session.held is not None:
            key = (session.opening, session.held.digest)
            previous = self._held.get(key)
            if previous is not None and previous.id != session.id:
                self._keys[previous.id].remove(key)
            elif previous is None:
                self._lengths.setdefault(session.opening, Counter())[session.held.length] += 1
            self._held[key] = session
            keys = self._keys.setdefault(session.id, [])
            if key not in keys:
                keys.append(key)
                if len(keys) > POINTS_PER_SESSION:
                    self._unindex(keys.pop(0))
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
        for key in self._keys.pop(session_id, []):
            self._unindex(key)
        if self._home.get(session.opening) == session_id:
            del self._home[session.opening]

    def _unindex(self, key: tuple[str, str]) -> None:
        point = self._held.pop(key)
        assert point.held is not None  # only held texts are indexed
        lengths = self._lengths[key[0]]
        lengths[point.held.length] -= 1
        if lengths[point.held.length] <= 0:
            del lengths[point.held.length]
        if not lengths:
            del self._lengths[key[0]]

    def _expire(self, now: float) -> None:
        # Sessions sit in write order, so the expired ones are all at the front.
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if oldest.last_access + self._ttl > now:
                break
            self._drop(oldest.id)
