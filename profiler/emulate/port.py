"""What an emulated node needs from an engine model: the port the real-time runtime drives.

The runtime (runtime.py) knows nothing of batching, caching or costs; an engine knows nothing
of HTTP or wall-clock time. `profiler.sim`'s Engine is adapted to this port (sim_engine.py);
`basic.BasicEngine` is a small self-contained implementation with a linear cost, used when no
preset is at hand and by the protocol tests, whose timings it makes easy to compute by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Job:
    """One request as an engine sees it.

    output_ids: the tokens it will emit, decided up front (synthetic text of an exact length),
      so the engine can cache generated tokens under the ids the next turn will send back.
    remote_kv: a D leg - the prompt's KV (beyond what the node holds) comes from a P; the job
      is not scheduled until `kv_arrived`.
    hold_kv: a P leg - keep the KV after the job ends until `release_kv` (D has pulled it).
    """

    id: str
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    remote_kv: bool = False
    hold_kv: bool = False


@dataclass(frozen=True, slots=True)
class Admission:
    """What the node knew about a job's prompt when it arrived."""

    local_hit_tokens: int  # prompt tokens found in this node's prefix cache
    remote_tokens: int  # prompt tokens whose KV must come from P (remote_kv jobs only)


@dataclass(slots=True)
class Tick:
    """One engine step: its modelled duration and what it produced."""

    duration_s: float
    emitted: dict[str, int] = field(default_factory=dict)  # job id -> tokens emitted
    finished: list[str] = field(default_factory=list)  # jobs that emitted their last token
    failed: dict[str, str] = field(default_factory=dict)  # job id -> reason (cannot ever fit)
    prefill_tokens: int = 0
    decode_seqs: int = 0


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Gauges and counters a node exports under vLLM's metric names."""

    running: int
    waiting: int
    kv_usage: float  # 0..1 of the KV capacity in use
    prefix_queries: int  # prompt tokens looked up in the local prefix cache
    prefix_hits: int
    external_queries: int  # prompt tokens looked up through the KV connector
    external_hits: int
    preemptions: int = 0


class NodeEngine(Protocol):
    """One vLLM-like node, stepped by the runtime (one step in flight at a time)."""

    block_size: int

    def submit(self, job: Job) -> Admission:
        """Queue a job; returns its prefix-cache hit and how many tokens P must send."""
        ...

    def kv_arrived(self, job_id: str) -> None:
        """A remote_kv job's KV is here: it may now be scheduled."""
        ...

    def release_kv(self, job_id: str) -> None:
        """A hold_kv job's KV was pulled (or will never be): free its blocks."""
        ...

    def abort(self, job_id: str) -> None:
        """Drop a job (the client went away); its blocks are freed."""
        ...

    def has_work(self) -> bool:
        """True when a step would schedule something."""
        ...

    def step(self) -> Tick:
        """Schedule and run one step (the runtime sleeps for its duration before delivering)."""
        ...

    def stats(self) -> EngineStats:
        """Current gauges and cumulative counters."""
        ...
