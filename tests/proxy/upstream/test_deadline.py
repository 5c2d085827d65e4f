"""`proxy.upstream.deadline`: one timer per request that only ever cancels a guarded wait."""

from __future__ import annotations

import asyncio

import pytest

from proxy.upstream.deadline import Deadline, DeadlineExceeded, guarded


async def test_a_guarded_wait_past_the_deadline_raises_deadline_exceeded() -> None:
    deadline = Deadline(0.05)
    with pytest.raises(DeadlineExceeded), deadline:
        await asyncio.sleep(5)
    assert deadline.expired
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # nothing left pending


async def test_expiry_outside_a_guard_cancels_nothing_and_the_next_guard_raises() -> None:
    deadline = Deadline(0.01)
    await asyncio.sleep(0.05)  # e.g. writing to the client: never interrupted
    assert deadline.expired
    with pytest.raises(DeadlineExceeded), deadline:
        pass


async def test_a_cancellation_that_is_not_the_deadlines_passes_through() -> None:
    deadline = Deadline(5)

    async def wait() -> None:
        with deadline:
            await asyncio.sleep(5)

    task = asyncio.create_task(wait())
    await asyncio.sleep(0.01)
    task.cancel()  # the client left
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not deadline.expired
    deadline.close()


async def test_a_closed_deadline_never_fires_and_none_guards_nothing() -> None:
    deadline = Deadline(0.01)
    deadline.close()
    await asyncio.sleep(0.05)
    assert not deadline.expired
    with guarded(None):
        await asyncio.sleep(0)
