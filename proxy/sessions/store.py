"""Where sessions live: the `SessionStore` interface, and `MemoryStore`, the default.

The router asks a store two things per turn: `resolve` (on the request path: which session,
does the request continue it) and `record` (once, when the turn completed: what D now holds).
`record` is a compare-and-set on the version the turn read, so concurrent turns of one
session, in one process or several, never corrupt it: the loser stays unrecorded.

`MemoryStore` keeps them in this process (`proxy.sessions.ledger`), with no dependency;
`proxy.sessions.redis_store.RedisStore` keeps them in Redis/Valkey, shared by every worker and
replica (`--session-store redis://HOST:PORT/DB`). `proxy.sessions.open_store` picks one from
the configuration.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from proxy.sessions.ledger import SessionLedger
from proxy.sessions.session import Held, Lookup, Transcript

MEMORY = "memory"


class SessionStore(ABC):
    """Sessions for the router; `start`/`close` run on the serving event loop."""

    shared = False  # whether several processes can use it at once
    records_rejected = 0  # records read back that held no session (dropped, counted)

    @property
    def up(self) -> bool:
        """False while the store cannot be reached (turns then run as new conversations)."""
        return True

    @abstractmethod
    async def resolve(self, transcript: Transcript, explicit_id: str | None = None) -> Lookup:
        """The session a request belongs to (a working copy) and whether it continues it."""

    @abstractmethod
    async def record(self, lookup: Lookup, held: Held | None) -> bool:
        """Record a completed turn; False if it lost to another turn of its session (or the
        store is unreachable): the turn then stays unrecorded."""

    @abstractmethod
    async def snapshot(self) -> list[dict[str, Any]]:
        """Live sessions as plain data (admin /sessions)."""

    @abstractmethod
    def live(self) -> int:
        """How many sessions are live (as of the last look, for a store elsewhere)."""

    async def start(self) -> None:
        """Connect, start background work (called once the event loop runs)."""
        return None  # nothing to start in this process

    async def close(self) -> None:
        """Stop background work and disconnect."""
        return None


class MemoryStore(SessionStore):
    """Sessions in this process only."""

    def __init__(self, ttl: float, max_sessions: int, clock: Callable[[], float]) -> None:
        self.ledger = SessionLedger(ttl, max_sessions, clock)

    async def resolve(self, transcript: Transcript, explicit_id: str | None = None) -> Lookup:
        return self.ledger.resolve(transcript, explicit_id)

    async def record(self, lookup: Lookup, held: Held | None) -> bool:
        return self.ledger.record_turn(lookup, held) is not None

    async def snapshot(self) -> list[dict[str, Any]]:
        return self.ledger.snapshot()

    def live(self) -> int:
        return len(self.ledger)


def watch_store(registry: CollectorRegistry, store: SessionStore) -> None:
    """The `ppd_session_store_up` gauge (1 while the store answers) on a metrics registry."""
    gauge = Gauge("ppd_session_store_up",
                  "1 while the session store answers; 0 means every turn runs P->D",
                  registry=registry)
    gauge.set_function(lambda: 1.0 if store.up else 0.0)
    registry.register(_RejectedRecords(store))


class _RejectedRecords(Collector):
    """`ppd_store_records_rejected_total`: bad records the store gave back, dropped."""

    def __init__(self, store: SessionStore) -> None:
        self._store = store

    def collect(self) -> Iterator[CounterMetricFamily]:
        counter = CounterMetricFamily(
            "ppd_store_records_rejected", "Session records read from the store that hold no "
            "session (wrong types, missing fields): dropped, the turn ran as a new one")
        counter.add_metric([], self._store.records_rejected)
        yield counter
