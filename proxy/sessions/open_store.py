"""The session store that `--session-store` names: in memory, or Redis/Valkey."""

from __future__ import annotations

from collections.abc import Callable

from proxy.sessions.store import MEMORY, MemoryStore, SessionStore


def open_store(url: str, ttl: float, max_sessions: int,
               clock: Callable[[], float]) -> SessionStore:
    """The store `--session-store` names: `memory`, or `redis://HOST:PORT/DB` (also rediss://,
    unix://)."""
    if url == MEMORY:
        return MemoryStore(ttl, max_sessions, clock)
    from proxy.sessions.redis_store import RedisStore  # the redis client is an optional dependency

    return RedisStore(url, ttl, max_sessions, clock)
