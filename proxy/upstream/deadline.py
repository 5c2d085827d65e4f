"""One request's deadline (`--request-timeout` bounds the whole request, stream included).

`asyncio.timeout` would do, but a stream would need one per chunk it reads (a scope around the
whole loop would fire while the client is being written to), and each costs a timer: ~16-30 us
a chunk with uvloop on this project's 2-core box, more than the relay's own work per token.
So one timer per request: when it fires, it cancels the request's task only while that task
is inside a guard (`with deadline:`, waiting on a node), and the guard turns that
cancellation into `DeadlineExceeded`; outside a guard it only marks the deadline expired,
and the next guard raises at once. A cancellation that is not the deadline's (the client
left) passes through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AbstractContextManager
from types import TracebackType


class DeadlineExceeded(Exception):
    """The request's budget ran out while it waited on a node."""


class Deadline:
    """A request's deadline, `seconds` from now on the running loop; `close()` when done.

    `with deadline:` guards a wait (a plain class, not `contextlib.contextmanager`: it runs
    once per streamed chunk, and the generator form cost ~7 us there)."""

    def __init__(self, seconds: float) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self.at = loop.time() + seconds
        self.expired = False
        self._guarded: asyncio.Task[object] | None = None
        self._depth = 0
        self._cancelled = False
        self._timer: asyncio.TimerHandle | None = loop.call_at(self.at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.expired = True
        if self._guarded is not None:
            self._cancelled = True
            self._guarded.cancel()

    def __enter__(self) -> None:
        if self.expired:
            raise DeadlineExceeded
        if self._depth == 0:  # a nested guard is covered by the outer one
            # The loop named: current_task() alone looks it up, a getpid() syscall each time.
            self._guarded = asyncio.current_task(self._loop)
        self._depth += 1

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._depth -= 1
        if self._depth:
            return
        task, self._guarded = self._guarded, None
        if self._cancelled and task is not None:
            self._cancelled = False
            # Whatever the block raised (or swallowed) came of our cancellation; unless the
            # client left meanwhile (another cancellation pending), it is the deadline.
            if task.uncancel() == 0:
                raise DeadlineExceeded from exc

    def close(self) -> None:
        """Drop the timer (the request is over)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


# Reentrant and stateless: one for every unguarded wait (a stream's reads call `guarded` per
# chunk; a new nullcontext each time was an allocation and an __init__ a chunk).
_UNGUARDED: AbstractContextManager[None] = contextlib.nullcontext()


def guarded(deadline: Deadline | None) -> AbstractContextManager[None]:
    """`with deadline:`, or nothing to guard when the request has no deadline."""
    return _UNGUARDED if deadline is None else deadline
