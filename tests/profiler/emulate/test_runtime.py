"""The real-time step loop: steps chain on the model's timeline, tokens arrive after their step,
held KV is released when D has it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from profiler.emulate.engine_interface import EngineStats, Job, Tick
from profiler.emulate.runtime import EmulatedNode, EngineFailed

STEP_S = 0.004


@dataclass
class ScriptedEngine:
    """One token per job per step, fixed step time; records what the runtime asked."""

    block_size: int = 16
    jobs: dict[str, int] = field(default_factory=dict)  # id -> tokens left
    step_calls: list[float] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    held: set[str] = field(default_factory=set)

    def cached_tokens(self, prompt_ids: object) -> int:
        return 0

    def submit(self, job: Job, now: float) -> None:
        self.jobs[job.id] = len(job.output_ids)
        if job.hold_kv:
            self.held.add(job.id)

    def next_step_time(self) -> float | None:
        return 0.0 if self.jobs else None

    def step(self, now: float) -> Tick:
        self.step_calls.append(now)
        tick = Tick(now, now + STEP_S)
        for job_id in list(self.jobs):
            tick.emitted[job_id] = 1
            self.jobs[job_id] -= 1
            if self.jobs[job_id] == 0:
                del self.jobs[job_id]
                tick.finished.append(job_id)
                tick.cached[job_id] = 7
        return tick

    def kv_arrived(self, job_id: str) -> None: ...

    def release_kv(self, job_id: str) -> None:
        self.released.append(job_id)

    def reset_prefix_cache(self) -> bool:
        return True

    def abort(self, job_id: str, now: float) -> None:
        self.jobs.pop(job_id, None)

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 0.0, 0, 0, 0, 0)


async def test_busy_steps_start_at_the_previous_modelled_end() -> None:
    engine = ScriptedEngine()
    node = EmulatedNode(engine)
    await node.start()
    try:
        stream = node.submit(Job("a", [1, 2, 3], [9] * 5))
        counts = [n async for n in stream.tokens()]
    finally:
        await node.stop()
    assert counts == [1] * 5 and stream.finished and stream.cached_tokens == 7
    # Each step after the first starts exactly where the model said the previous one ended,
    # however late the loop woke up.
    gaps = [b - a for a, b in zip(engine.step_calls, engine.step_calls[1:], strict=False)]
    assert len(gaps) == 4 and all(abs(gap - STEP_S) < 1e-9 for gap in gaps)
    assert node.pacing.steps == 5 and node.pacing.tokens == 5


async def test_a_held_p_job_is_released_once_d_has_its_kv() -> None:
    engine = ScriptedEngine()
    node = EmulatedNode(engine)
    await node.start()
    try:
        stream = node.submit(Job("p", [1, 2], [9], hold_kv=True))
        assert [n async for n in stream.tokens()] == [1]
        assert engine.released == []
        node.hold_released("p")
        node.hold_released("p")  # a second notice changes nothing
    finally:
        await node.stop()
    assert engine.released == ["p"]


async def test_an_aborted_job_leaves_the_engine() -> None:
    engine = ScriptedEngine()
    node = EmulatedNode(engine)
    await node.start()
    try:
        node.submit(Job("gone", [1], [9] * 1000))
        node.abort("gone")
        node.abort("gone")
    finally:
        await node.stop()
    assert engine.jobs == {}


async def test_a_broken_engine_fails_its_requests_instead_of_hanging() -> None:
    engine = ScriptedEngine()

    def explode(now: float) -> Tick:
        raise AssertionError("engine bug")

    engine.step = explode  # type: ignore[method-assign]
    node = EmulatedNode(engine)
    await node.start()
    try:
        stream = node.submit(Job("a", [1], [9, 9]))
        with pytest.raises(EngineFailed, match="engine bug"):
            _ = [n async for n in stream.tokens()]
        with pytest.raises(EngineFailed):
            node.submit(Job("b", [1], [9]))
    finally:
        await node.stop()
