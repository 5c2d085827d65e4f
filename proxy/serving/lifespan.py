"""An ASGI app's lifespan (start-up and shutdown), driven by `proxy.serving.server` itself.

The server runs the app's start-up before it listens and its shutdown after the last
connection closed, whatever ASGI server moves the bytes; a failing start-up raises here with
the app's own message instead of ending the process (uvicorn calls sys.exit on it).
An app that does not speak the lifespan protocol (it raises or returns at once) has none.
"""

from __future__ import annotations

import asyncio
from typing import Any


class LifespanError(RuntimeError):
    """The app reported its start-up or shutdown as failed."""


class Lifespan:
    """`await startup()` before serving, `await shutdown()` after."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        """Run the app's start-up; raises LifespanError when it fails."""
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}}
        self._task = asyncio.create_task(self._app(scope, self._inbox.get, self._outbox.put))
        await self._event("startup")

    async def shutdown(self) -> None:
        """Run the app's shutdown; raises LifespanError when it fails."""
        if self._task is not None and not self._task.done():
            await self._event("shutdown")

    async def _event(self, name: str) -> None:
        assert self._task is not None
        await self._inbox.put({"type": f"lifespan.{name}"})
        reply = asyncio.ensure_future(self._outbox.get())
        await asyncio.wait({reply, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not reply.done():  # the app ended without answering: it has no lifespan
            reply.cancel()
            return
        message = reply.result()
        if message["type"] == f"lifespan.{name}.failed":
            raise LifespanError(f"{name} failed: {message.get('message', '')}")
