"""Which blocks each session's D keeps for a readback (`proxy.readback.protocol`), read at most
once.

One entry per (session, held text): the `HeldKV` D named in its answer to the turn that made
that text, kept only from a D's own answer (a client's kv_transfer_params never reach it). An
entry is taken, not read: once P has read D's blocks, D frees them (vLLM frees them when P's
notification arrives), so a second reader - a concurrent turn of the session, a fork of an
older point, a retry - could read blocks D has since given to another request. It expires
with D's TTL, less a margin (`proxy.readback.protocol.EXPIRY_MARGIN_S`).

`ReadbackBook` keeps the entries in this process, bounded like the in-memory ledger (least
recently written first): the book of the default memory session store, and of the simulator's
proxy, which asks it synchronously (`readback_status`, `take_readback`). The router awaits its
book through `proxy.sessions.readbacks.Readbacks`: this one wrapped, or, when the sessions are
in Redis (`--workers N`, `--session-store redis://...`), the entries beside them
(`proxy.sessions.redis_readbacks`), so the worker or replica that serves a session's next turn
takes the entry whichever one recorded it. Either way a turn that finds no entry goes P->D
(`readback_missing`), never to a wrong one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from proxy.readback.protocol import HeldKV
from proxy.sessions.session import Lookup
from proxy.shared.vocabulary import Reason

# The book's byte bound by default (--readback-book-bytes): a 128k-token turn's entry is
# ~1 MB (its token ids), so this holds 64 of the longest and thousands of ordinary ones.
DEFAULT_BOOK_BYTES = 64 * 1024 * 1024
_ENTRY_OVERHEAD = 512  # the entry's objects and D's scalar params


def entry_bytes(held: HeldKV) -> int:
    """About what one entry costs: its token ids (8 bytes each), D's block ids (a list of
    ints, ~36 bytes each) and the objects around them."""
    blocks = held.params.get("remote_block_ids")
    return (held.token_ids.itemsize * len(held.token_ids)
            + 36 * (len(blocks) if isinstance(blocks, list) else 0) + _ENTRY_OVERHEAD)


class ReadbackBook:
    """Each session's latest HeldKV, with the digest of the text it holds; the clock is
    injected."""

    def __init__(self, max_entries: int, clock: Callable[[], float],
                 max_bytes: int = DEFAULT_BOOK_BYTES) -> None:
        self._max = max_entries
        self._max_bytes = max_bytes  # --readback-book-bytes: 60 sessions once took 582 MB
        self._bytes = 0
        self._clock = clock
        self._entries: OrderedDict[str, tuple[str, HeldKV]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """About how much memory the entries hold (`entry_bytes` summed)."""
        return self._bytes

    def put(self, session_id: str, digest: str, held: HeldKV) -> None:
        """D keeps `held` for the session's text `digest`; it replaces the session's older
        entry, whose text no next turn continues (D frees those blocks at its TTL). Expired
        entries go first, then the least recently written past the count or byte bound."""
        self.discard(session_id)
        self._entries[session_id] = (digest, held)
        self._bytes += entry_bytes(held)
        now = self._clock()
        while self._entries and (
                len(self._entries) > self._max or self._bytes > self._max_bytes
                or next(iter(self._entries.values()))[1].expires <= now):
            _, (_, gone) = self._entries.popitem(last=False)
            self._bytes -= entry_bytes(gone)

    def discard(self, session_id: str) -> None:
        """The session moved on without D keeping anything: its older entry is stale."""
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            self._bytes -= entry_bytes(entry[1])

    def status(self, session_id: str, digest: str | None) -> Reason | None:
        """None when a readback can be offered now, else why not (missing, expired)."""
        entry = self._entries.get(session_id)
        if entry is None or digest is None or entry[0] != digest:
            return Reason.READBACK_MISSING
        if self._clock() >= entry[1].expires:
            return Reason.READBACK_EXPIRED
        return None

    def take(self, session_id: str, digest: str | None) -> HeldKV | Reason:
        """The entry, removed (no one reads D's blocks twice), or why there is none."""
        why = self.status(session_id, digest)
        if why is Reason.READBACK_MISSING:
            return why
        _, held = self._entries.pop(session_id)
        self._bytes -= entry_bytes(held)
        return held if why is None else why


def readback_status(book: ReadbackBook | None, lookup: Lookup) -> Reason | None:
    """None when the session's D keeps blocks P can read back now, else why not (`book`
    None: this proxy offers no readback). The router and the simulator's proxy both ask here."""
    if book is None:
        return Reason.READBACK_MISSING
    return book.status(lookup.session.id, held_digest(lookup))


def take_readback(book: ReadbackBook | None, lookup: Lookup) -> HeldKV | Reason:
    """The session's kept blocks for this turn's readback, taken from the book, or why not."""
    if book is None:
        return Reason.READBACK_MISSING
    return on_sessions_decode(book.take(lookup.session.id, held_digest(lookup)), lookup)


def held_digest(lookup: Lookup) -> str | None:
    """The digest of the text the session's D holds, which an entry must be for to be read
    back; None when the turn continues nothing (a new conversation or branch) or D holds
    nothing known."""
    held = lookup.session.held
    return held.digest if lookup.continuation and held is not None else None


def on_sessions_decode(taken: HeldKV | Reason, lookup: Lookup) -> HeldKV | Reason:
    """A taken entry if its blocks are on the session's D now, else missing: the session
    moved to another D since (its next leg goes there; the entry is gone all the same)."""
    if isinstance(taken, HeldKV) and taken.decode != lookup.session.decode:
        return Reason.READBACK_MISSING
    return taken
