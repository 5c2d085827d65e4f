"""How the router reaches the readback book (`proxy.sessions.readback_book`): `Readbacks`.

The router awaits its book, because a shared one is a round trip away: with `--workers N` or
replicas on one `--session-store redis://...` the turn after a readback-keeping one may land on
any process, and finds its entry only if every process reads the same book
(`proxy.sessions.redis_readbacks.RedisReadbacks`, beside the sessions). `MemoryReadbacks` wraps
this process's `ReadbackBook`, the book of the default memory session store (whose sessions no
other process sees either). `proxy.serving.app` picks one from the session store.

Every implementation answers as the memory book does: an entry only for the text the session's
D holds now, taken at most once (D frees the blocks once P has read them), expired by the
router's clock, and a reason instead of an error whenever there is none (the turn goes P->D).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from proxy.readback.protocol import HeldKV
from proxy.sessions.readback_book import ReadbackBook, readback_status, take_readback
from proxy.sessions.session import Lookup
from proxy.shared.vocabulary import Reason


class Readbacks(ABC):
    """Each session's latest HeldKV for the router: asked before a turn is planned, taken by
    its readback attempt, written once a turn is recorded."""

    @abstractmethod
    async def status(self, lookup: Lookup) -> Reason | None:
        """None when the session's D keeps blocks P can read back now, else why not; reads,
        never removes."""

    @abstractmethod
    async def take(self, lookup: Lookup) -> HeldKV | Reason:
        """The session's kept blocks, removed so no other turn or process reads them, or why
        there are none."""

    @abstractmethod
    async def put(self, session_id: str, digest: str, held: HeldKV) -> None:
        """D keeps `held` for the session's text `digest` (it replaces the older entry)."""

    @abstractmethod
    async def discard(self, session_id: str) -> None:
        """The session moved on without D keeping anything: its older entry is stale."""


class MemoryReadbacks(Readbacks):
    """The book in this process (`ReadbackBook`), behind the router's awaitable interface."""

    def __init__(self, book: ReadbackBook) -> None:
        self.book = book

    async def status(self, lookup: Lookup) -> Reason | None:
        return readback_status(self.book, lookup)

    async def take(self, lookup: Lookup) -> HeldKV | Reason:
        return take_readback(self.book, lookup)

    async def put(self, session_id: str, digest: str, held: HeldKV) -> None:
        self.book.put(session_id, digest, held)

    async def discard(self, session_id: str) -> None:
        self.book.discard(session_id)
