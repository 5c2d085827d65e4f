"""Shared fixtures: fake vLLM nodes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from tests.fakes.fake_vllm import FakeVLLM


@pytest.fixture
async def cluster() -> AsyncIterator[dict[str, FakeVLLM]]:
    """Two P and two D fake nodes, running."""
    async with contextlib.AsyncExitStack() as stack:
        nodes = {name: await stack.enter_async_context(FakeVLLM(name))
                 for name in ("p1", "p2", "d1", "d2")}
        yield nodes
