"""profiler.engine's Engine behind the emulator's engine interface (engine_interface.py).

Two things the adapter adds to the engine:
- output token ids: the engine draws its own (random) ids; the emulator's replies are word
  tokens that the next turn sends back, so each emitted id is replaced by the job's own
  before the next step hashes the block it completes - D's prefix cache then holds the reply
  under the ids turn 2 brings, as vLLM's would;
- memory: a finished job's engine record is dropped once nothing needs it (P: after release_kv);
- KV cache events (with `events`): each step's stores and evictions, stores tagged with
  their job's session, on `Tick.kv_events`.
"""

from __future__ import annotations

from collections.abc import Sequence

from profiler.emulate.cache_events import CacheEvents
from profiler.emulate.engine_interface import EngineStats, Job, JobRejected, Tick
from profiler.engine import Engine, Request, RequestRejected
from profiler.engine.prefix_cache import block_hashes
from profiler.engine.requests import Phase
from profiler.engine.requests import Sequence as EngineSequence

# kv_from names the P a request pulls from; the engine only needs it to be set.
REMOTE = "remote-p"


class SimNodeEngine:
    """Adapts profiler.engine.Engine to profiler.emulate.engine_interface.NodeEngine."""

    def __init__(self, engine: Engine, events: CacheEvents | None = None) -> None:
        """events: the engine's cache observer, if it has one (its steps' KV events)."""
        self.engine = engine
        self._events = events
        self.block_size = engine.config.block_size
        self._outputs: dict[str, Sequence[int]] = {}
        # finished P jobs whose KV waits for its D; D jobs kept for a readback
        self._held: set[str] = set()

    def submit(self, job: Job, now: float) -> None:
        try:
            self.engine.submit(Request(
                job.id, max_tokens=len(job.output_ids), prompt_token_ids=list(job.prompt_ids),
                kv_from=REMOTE if job.remote_kv else None, send_kv=job.hold_kv,
                keep_kv=job.keep_kv_s is not None,
                preloaded=job.preloaded,
            ), now)  # fmt: skip
        except RequestRejected as exc:
            raise JobRejected(str(exc)) from None
        self._outputs[job.id] = job.output_ids
        if self._events is not None and job.session_id is not None:
            self._events.tag(job.id, job.session_id)

    def cached_tokens(self, prompt_ids: Sequence[int]) -> int:
        """Leading tokens of prompt_ids this node's prefix cache holds (whole blocks)."""
        return self.engine.cached_prefix_tokens(block_hashes(list(prompt_ids), self.block_size))

    def next_step_time(self) -> float | None:
        return self.engine.next_step_time()

    def step(self, now: float) -> Tick:
        result = self.engine.step(now)
        tick = Tick(result.start, result.end, kv_pulls=list(result.kv_pulls),
                    prefill_tokens=result.shape.sum_prefill_tokens,
                    decode_seqs=result.shape.num_decode_requests)  # fmt: skip
        if self._events is not None:
            tick.kv_events = self._events.take()
        for job_id in result.tokens:
            seq = self.engine.sequence(job_id)
            produced = len(seq.output_token_ids)
            seq.output_token_ids[-1] = self._outputs[job_id][produced - 1]
            tick.emitted[job_id] = 1
        for job_id in result.finished:
            seq = self.engine.sequence(job_id)
            tick.finished.append(job_id)
            tick.cached[job_id] = seq.num_cached_prompt + seq.num_external
            if seq.request.send_kv or seq.request.keep_kv:
                self._held.add(job_id)
            else:
                self._forget(job_id)
        return tick

    def kv_arrived(self, job_id: str) -> None:
        seq = self._sequence(job_id)
        if seq is not None and seq.phase is Phase.WAITING_KV:
            self.engine.kv_arrived(job_id)

    def release_kv(self, job_id: str) -> None:
        if job_id in self._held:
            self._held.discard(job_id)
            self.engine.release_kv(job_id)
            self._forget(job_id)

    def reset_prefix_cache(self) -> bool:
        return self.engine.reset_prefix_cache()

    def abort(self, job_id: str, now: float) -> None:
        if self._sequence(job_id) is None:
            return
        self._held.discard(job_id)
        self.engine.abort(job_id, now)
        self._forget(job_id)

    def stats(self) -> EngineStats:
        s = self.engine.stats()
        return EngineStats(
            running=s.num_running, waiting=s.num_waiting + s.num_waiting_kv,
            kv_usage=s.kv_usage, prefix_queries=s.prefix_cache_queries,
            prefix_hits=s.prefix_cache_hits, external_queries=s.external_prefix_cache_hits,
            external_hits=s.external_prefix_cache_hits, preemptions=s.num_preemptions,
        )  # fmt: skip

    def _sequence(self, job_id: str) -> EngineSequence | None:
        try:
            return self.engine.sequence(job_id)
        except KeyError:
            return None

    def _forget(self, job_id: str) -> None:
        self._outputs.pop(job_id, None)
        if self._events is not None:
            self._events.untag(job_id)
        self.engine.forget(job_id)
