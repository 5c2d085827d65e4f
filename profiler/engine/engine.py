"""One vLLM-like node in time given by its caller: continuous batching over a cost model.

The engine never reads a clock. A driver asks `next_step_time()`, calls `step(now)`, and
delivers the step's tokens at `result.end`: in virtual time (`simulate.py`, a discrete-event
simulator) or in real time (an emulated HTTP node sleeping until `end`). Requests submitted
while a step runs join the next one, as in vLLM.

    engine = Engine(EngineConfig(role=Role.DECODE), cost)
    engine.submit(Request("r1", max_tokens=64, prompt_token_ids=ids), now=0.0)
    while (start := engine.next_step_time()) is not None:
        result = engine.step(max(start, now))      # result.tokens, .finished, .end
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from profiler.engine.batch import BatchShape
from profiler.engine.config import EngineConfig
from profiler.engine.cost import CostModel
from profiler.engine.host import host_of
from profiler.engine.prefix_cache import CacheObserver, block_hashes
from profiler.engine.requests import Phase, Request, RequestRejected, Sequence
from profiler.engine.scheduler import ScheduledItem, Scheduler
from proxy.shared.vocabulary import Role


@dataclass(frozen=True, slots=True)
class StepResult:
    """One step: it runs from `start` to `end`; its tokens exist from `end` on."""

    start: float
    end: float
    shape: BatchShape
    tokens: dict[str, int] = field(default_factory=dict)  # request id -> the token it emitted
    finished: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()
    # D requests that got their blocks this step and now wait for their prompt's KV:
    # (id, tokens to pull from the P). The driver models the transfer, then `kv_arrived`.
    kv_pulls: tuple[tuple[str, int], ...] = ()

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot in vLLM's metric terms (token counters are cumulative)."""

    num_running: int
    num_waiting: int
    num_waiting_kv: int
    kv_usage: float  # fraction of blocks held by requests
    prefix_cache_queries: int
    prefix_cache_hits: int
    external_prefix_cache_queries: int  # prompt tokens of requests whose KV came from a P
    external_prefix_cache_hits: int
    num_preemptions: int
    num_evictions: int


class Engine:
    def __init__(self, config: EngineConfig, cost: CostModel,
                 cache_observer: CacheObserver | None = None) -> None:
        """cache_observer: told of every block stored in or evicted from the prefix cache
        (`prefix_cache.CacheObserver`; an emulated node publishes them as KV events)."""
        self.config = config
        self.cost = cost
        self._scheduler = Scheduler(config, cache_observer)
        self._rng = random.Random(config.seed)
        self._seqs: dict[str, Sequence] = {}  # every request not yet forgotten
        self._kv_held: dict[str, Sequence] = {}  # P: finished, blocks kept for the D
        self._busy_until = float("-inf")
        self._last_start = float("-inf")  # start of the step that ends at _busy_until
        # Nothing was left to run when the last step ended: the next step starts cold. Not a
        # clock comparison: a real-time driver calls step() a little after _busy_until.
        self._idle = True
        host = host_of(cost)
        self._schedules_ahead = host.schedules_ahead
        self._cold_step = host.cold_step_ms
        self._stalled = False  # the last step scheduled nothing and nothing changed since
        self._num_preemptions = 0

    # -- requests in -----------------------------------------------------------------------

    def submit(self, request: Request, now: float) -> None:
        """Queue a request. Raises RequestRejected if it could never run here."""
        if request.id in self._seqs:
            raise ValueError(f"request id {request.id} is already in the engine")
        if request.kv_from is not None and self.config.role is Role.PREFILL:
            raise RequestRejected(f"request {request.id}: a P node does not receive KV")
        total = request.num_prompt_tokens + request.max_tokens
        if total > self.config.max_model_len:
            raise RequestRejected(
                f"request {request.id}: {request.num_prompt_tokens} prompt + "
                f"{request.max_tokens} output tokens exceed max_model_len "
                f"{self.config.max_model_len}")
        if -(-total // self.config.block_size) > self.config.num_kv_blocks:
            raise RequestRejected(
                f"request {request.id}: {total} tokens exceed the KV cache "
                f"({self.config.kv_capacity_tokens} tokens)")
        if request.prompt_hashes is not None:
            hashes = self._given_hashes(request)
        elif request.prompt_token_ids is not None:
            hashes = block_hashes(request.prompt_token_ids, self.config.block_size)
        else:
            assert request.block_hashes is not None
            hashes = list(request.block_hashes)
        seq = Sequence(request=request, arrival=now, block_hashes=hashes)
        self._seqs[request.id] = seq
        self._scheduler.waiting.append(seq)
        self._stalled = False

    def _given_hashes(self, request: Request) -> list[int]:
        """A request's own prompt hashes, if they can be this node's: one per full block at
        its block size (a caller that hashed at another size gets an error, not misses)."""
        assert request.prompt_hashes is not None and request.prompt_token_ids is not None
        full = len(request.prompt_token_ids) // self.config.block_size
        if len(request.prompt_hashes) != full:
            raise ValueError(f"request {request.id}: {len(request.prompt_hashes)} prompt "
                             f"hashes for {full} full blocks of {self.config.block_size} "
                             "tokens (hashed at another block size?)")
        return list(request.prompt_hashes)

    def kv_arrived(self, request_id: str) -> None:
        """D: the prompt's KV pulled from the P is in; the request can decode."""
        seq = self._get(request_id)
        if seq.phase is not Phase.WAITING_KV:
            raise ValueError(f"request {request_id} is not waiting for KV ({seq.phase})")
        self._scheduler.kv_arrived(seq)
        self._stalled = False

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache (vLLM's POST /reset_prefix_cache): False while any request
        holds KV blocks."""
        return self._scheduler.cache.reset()

    def release_kv(self, request_id: str) -> None:
        """P: the D has read this finished request's KV (D, with `keep_kv`: P has read it
        back, or its TTL passed); its blocks become cached/free."""
        seq = self._kv_held.pop(request_id, None)
        if seq is None:
            raise ValueError(f"request {request_id} holds no KV for a transfer")
        self._scheduler.free(seq)
        self._stalled = False

    def abort(self, request_id: str, now: float, reason: str = "aborted") -> None:
        """Drop a request wherever it is (client gone, timeout, transfer failed)."""
        seq = self._get(request_id)
        if seq.phase in (Phase.FINISHED, Phase.FAILED):
            if self._kv_held.pop(request_id, None) is not None:  # a P whose D never came
                self._scheduler.free(seq)
                self._stalled = False
            return
        self._scheduler.drop(seq)
        seq.phase, seq.error, seq.finish_time = Phase.FAILED, reason, now
        self._stalled = False

    # -- time ---------------------------------------------------------------------------------

    def next_step_time(self) -> float | None:
        """When the next step can start (possibly in the past: start it at max(now, this)),
        or None when there is nothing to run until a submit, kv_arrived or release_kv."""
        if self._stalled or not self._scheduler.has_work():
            return None
        return self._busy_until

    def step(self, now: float) -> StepResult:
        """Schedule and run one step starting at `now` (not before the previous step's end)."""
        cold = self._idle  # no step in flight: nothing hides this one's host work
        start = max(now, self._busy_until)
        # vLLM's async scheduling scheduled this step while the previous one started on the
        # GPU: requests that came later wait for the step after (`HostModel.schedules_ahead`).
        admit_until = start if cold or not self._schedules_ahead else self._last_start
        batch = self._scheduler.schedule(admit_until)
        shape = batch_shape(batch)
        step_ms = self.cost.step_ms(shape) + (self._cold_step(shape) if cold else 0.0)
        end = start + step_ms / 1000.0
        self._busy_until, self._last_start = end, start
        self._idle = not batch
        self._stalled = not batch and not self._scheduler.kv_pulls
        self._num_preemptions += len(self._scheduler.preempted)
        tokens: dict[str, int] = {}
        finished: list[str] = []
        block_size, vocab, draw = self.config.block_size, self.config.vocab_size, self._rng.random
        for seq, count in batch:  # the hot loop: one pass per scheduled request per step
            if seq.scheduled_time is None:
                seq.scheduled_time = start
            computed = seq.num_computed = seq.num_computed + count
            if computed // block_size > len(seq.held_hashes):
                self._scheduler.register_full_blocks(seq)
            outputs = seq.output_token_ids
            if computed < seq.num_prompt + len(outputs):
                continue  # a prompt chunk that is not the last: nothing sampled yet
            request = seq.request
            given = request.output_token_ids
            token = given[len(outputs)] if given is not None else int(draw() * vocab)
            outputs.append(token)
            tokens[request.id] = token
            if seq.first_token_time is None:
                seq.first_token_time = end
            if len(outputs) >= request.max_tokens:
                self._finish(seq, end)
                finished.append(request.id)
        self._idle = self._idle or not self._scheduler.has_work()
        return StepResult(start=start, end=end, shape=shape, tokens=tokens,
                          finished=tuple(finished),
                          preempted=tuple(self._scheduler.preempted),
                          kv_pulls=tuple(self._scheduler.kv_pulls))

    def _finish(self, seq: Sequence, now: float) -> None:
        self._scheduler.running.remove(seq)  # still holds its blocks: P keeps them for the D
        seq.phase, seq.finish_time = Phase.FINISHED, now
        if seq.request.send_kv or seq.request.keep_kv:
            self._kv_held[seq.id] = seq
        else:
            self._scheduler.free(seq)

    # -- reading ------------------------------------------------------------------------------

    def sequence(self, request_id: str) -> Sequence:
        """The engine's running record of a request (its outputs, times, cache hits)."""
        return self._get(request_id)

    def forget(self, request_id: str) -> Sequence:
        """Drop a finished or failed request's record (long runs keep memory bounded)."""
        seq = self._get(request_id)
        if seq.phase not in (Phase.FINISHED, Phase.FAILED) or request_id in self._kv_held:
            raise ValueError(f"request {request_id} is still in use ({seq.phase})")
        return self._seqs.pop(request_id)

    def cached_prefix_tokens(self, hashes: Iterable[int]) -> int:
        """Leading tokens of a block-hash chain (`prefix_cache.block_hashes` at this node's
        block size) its prefix cache holds now: what its KV cache events tell a subscriber;
        `--policy live` reads it."""
        return self._scheduler.cache.longest_prefix(hashes) * self.config.block_size

    def num_running(self) -> int:
        """Requests in the running batch now (prefilling or decoding)."""
        return len(self._scheduler.running)

    def running_output_lengths(self) -> list[int]:
        """max_tokens of each request in the running batch (what a proxy knows of its own
        requests on this node; `--policy live` reads it)."""
        return [seq.request.max_tokens for seq in self._scheduler.running]

    def stats(self) -> EngineStats:
        scheduler = self._scheduler
        return EngineStats(
            num_running=len(scheduler.running), num_waiting=len(scheduler.waiting),
            num_waiting_kv=len(scheduler.waiting_kv), kv_usage=scheduler.cache.usage,
            prefix_cache_queries=scheduler.prefix_queries,
            prefix_cache_hits=scheduler.prefix_hits,
            external_prefix_cache_queries=scheduler.external_queries,
            external_prefix_cache_hits=scheduler.external_hits,
            num_preemptions=self._num_preemptions,
            num_evictions=scheduler.cache.num_evictions)

    def _get(self, request_id: str) -> Sequence:
        try:
            return self._seqs[request_id]
        except KeyError:
            raise KeyError(f"unknown request id {request_id}") from None


def batch_shape(batch: list[ScheduledItem]) -> BatchShape:
    """The cost model's view of a batch: a one-token item with context is a decode."""
    n_prefill = prefill_tokens = prefill_context = n_decode = decode_context = 0
    for seq, count in batch:
        if count == 1 and seq.num_computed > 0:
            n_decode += 1
            decode_context += seq.num_computed + 1
        else:
            n_prefill += 1
            prefill_tokens += count
            prefill_context += seq.num_computed
    return BatchShape(n_prefill, prefill_tokens, prefill_context, n_decode, decode_context)
