"""What an emulated node needs from an engine model: the interface the real-time runtime drives.

The runtime (runtime.py) knows nothing of batching, caching or costs; an engine knows nothing
of HTTP or of the wall clock: its caller passes `now` in. The interface follows
profiler.engine's Engine (next_step_time / step(now) / kv_pulls / kv_arrived / release_kv),
adapted by modelled_engine.py; the runtime tests drive it with a scripted engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from proxy.live.kv_events import KvEvent


class JobRejected(ValueError):
    """The job can never run on this node (too long for the model or its KV cache)."""


@dataclass(frozen=True, slots=True)
class Job:
    """One request as an engine sees it.

    output_ids: the tokens it will emit, decided up front (synthetic text of an exact length),
      so the engine caches generated tokens under the ids the next turn will send back.
    remote_kv: a D leg - the prompt's KV (beyond what the node holds) comes from a P: once
      the engine has blocks for it, it asks for a pull (Tick.kv_pulls) and waits for
      `kv_arrived`.
    hold_kv: a P leg - keep the KV after the job ends until `release_kv` (D has pulled it).
    keep_kv_s: a D (or local) leg on a node with bidirectional transfer - keep the KV after
      the job ends, for a readback, until `release_kv` (a P has read it) or this many seconds.
    session_id: the request's `session_id` field; the blocks it stores carry it in the node's
      KV cache events (as vLLM >= 0.32 tags them).
    preloaded: leading prompt tokens whose KV was read back from a D before the job was
      submitted (a readback P leg): they count as computed.
    """

    id: str
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    remote_kv: bool = False
    hold_kv: bool = False
    keep_kv_s: float | None = None
    session_id: str | None = None
    preloaded: int = 0


@dataclass(slots=True)
class Tick:
    """One engine step, from `start` to `end` (the caller's clock), and what it produced."""

    start: float
    end: float
    emitted: dict[str, int] = field(default_factory=dict)  # job id -> tokens emitted
    finished: list[str] = field(default_factory=list)  # jobs that emitted their last token
    # prompt tokens a finished job found cached (local prefix hits plus KV received from P)
    cached: dict[str, int] = field(default_factory=dict)
    kv_pulls: list[tuple[str, int]] = field(default_factory=list)  # (D job, tokens to pull)
    prefill_tokens: int = 0
    decode_seqs: int = 0
    # the prefix cache's changes since the previous step (a node that publishes KV events)
    kv_events: list[KvEvent] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Gauges and counters a node exports under vLLM's metric names."""

    running: int
    waiting: int
    kv_usage: float  # 0..1 of the KV capacity in use
    prefix_queries: int  # prompt tokens looked up in the local prefix cache
    prefix_hits: int
    external_queries: int  # prompt tokens asked of the KV connector (a P)
    external_hits: int
    preemptions: int = 0


class NodeEngine(Protocol):
    """One vLLM-like node, stepped by the runtime (one step in flight at a time)."""

    block_size: int

    def submit(self, job: Job, now: float) -> None:
        """Queue a job (JobRejected if it can never run here)."""
        ...

    def cached_tokens(self, prompt_ids: Sequence[int]) -> int:
        """Leading tokens of prompt_ids the node's prefix cache holds (a readback reads only
        the rest)."""
        ...

    def next_step_time(self) -> float | None:
        """When the next step may start (maybe in the past), or None: nothing to run."""
        ...

    def step(self, now: float) -> Tick:
        """Schedule and run one step starting at `now`; its tokens exist from `Tick.end`."""
        ...

    def kv_arrived(self, job_id: str) -> None:
        """A remote_kv job's KV is here: it may now be scheduled."""
        ...

    def release_kv(self, job_id: str) -> None:
        """A hold_kv (or keep_kv_s) job's KV was read (or never will be): free its blocks."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Forget the cached prefixes (vLLM's POST /reset_prefix_cache); False while a job
        holds blocks."""
        ...

    def abort(self, job_id: str, now: float) -> None:
        """Drop a job (the client went away); its blocks are freed. Unknown ids are ignored."""
        ...

    def stats(self) -> EngineStats:
        """Current gauges and cumulative counters."""
        ...
