"""Run async test servers (fake nodes, the in-process proxy) on a background event loop.

For tests of CLI commands that run `asyncio.run` and install signal handlers themselves, so
they must own the main thread:

    @asynccontextmanager
    async def cluster():
        async with FakeVLLM("p") as p, running(create_app(config(p))) as proxy:
            yield proxy.url, p

    with in_background(cluster) as (url, p):
        assert ppd(["profile", "--target", url, ...]) == 1
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def in_background(factory: Callable[[], AbstractAsyncContextManager[T]]) -> Iterator[T]:
    """Enter factory() on an event loop in a daemon thread; yield what it yields; exit it."""
    handed: queue.Queue[tuple[bool, object]] = queue.Queue()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def run() -> None:
        try:
            async with factory() as value:
                handed.put((True, value))
                await stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            handed.put((False, exc))

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    try:
        ok, value = handed.get(timeout=30)
        if not ok:
            raise RuntimeError("the background servers did not start") from value  # type: ignore[misc]
        yield value  # type: ignore[misc]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()
