"""A small vLLM-like engine with a linear step cost: the port's reference implementation.

Continuous batching with decode first (every running decode gets its token, then prefill
chunks fill the token budget), a block-granular prefix cache keyed by the hash chain of full
blocks with LRU reuse of free cached blocks, and preemption by recompute when blocks run out.
Step time = base + per prefill token + per decode sequence + per decode context token.
Deterministic: no clock and no randomness inside.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from profiler.emulate.port import Admission, EngineStats, Job, Tick


@dataclass(frozen=True, slots=True)
class LinearCost:
    """Seconds per step = base + prefill tokens, decode sequences and their context."""

    base_s: float = 0.005
    per_prefill_token_s: float = 0.0001
    per_decode_seq_s: float = 0.0002
    per_context_token_s: float = 0.0

    def step_s(self, prefill_tokens: int, decode_contexts: Sequence[int]) -> float:
        return (self.base_s + self.per_prefill_token_s * prefill_tokens
                + self.per_decode_seq_s * len(decode_contexts)
                + self.per_context_token_s * sum(decode_contexts))  # fmt: skip


@dataclass(frozen=True, slots=True)
class BasicConfig:
    block_size: int = 16
    kv_blocks: int = 8192
    max_batched_tokens: int = 2048
    max_seqs: int = 256


@dataclass(slots=True)
class _Seq:
    job: Job
    hashes: list[int]  # hash chain of the full blocks of prompt + output
    computed: int = 0  # tokens whose KV exists
    emitted: int = 0
    blocks: int = 0  # blocks held (shared cached ones included)
    ready: bool = True  # False while a remote_kv job waits for its KV
    holding: bool = False  # a hold_kv job that finished and keeps its blocks

    @property
    def tokens(self) -> int:
        return len(self.job.prompt_ids) + self.emitted

    @property
    def target(self) -> int:
        """Tokens whose KV must exist before the next token: the prompt, then all but the last."""
        return len(self.job.prompt_ids) + max(self.emitted - 1, 0)

    @property
    def prefilling(self) -> bool:
        return self.computed < self.target


def block_hashes(ids: Sequence[int], block_size: int) -> list[int]:
    """The hash chain of the full blocks of ids (each hash covers everything before it)."""
    out: list[int] = []
    parent = 0
    for start in range(0, len(ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(ids[start:start + block_size])))
        out.append(parent)
    return out


@dataclass(slots=True)
class BasicEngine:
    cost: LinearCost = field(default_factory=LinearCost)
    config: BasicConfig = field(default_factory=BasicConfig)
    _seqs: dict[str, _Seq] = field(default_factory=dict)
    _order: list[str] = field(default_factory=list)  # arrival order of unfinished jobs
    _cached: OrderedDict[int, None] = field(default_factory=OrderedDict)  # free cached, LRU first
    _in_use: int = 0
    _counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("queries", "hits", "ext_queries", "ext_hits", "preemptions"), 0))

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def submit(self, job: Job) -> Admission:
        hashes = block_hashes([*job.prompt_ids, *job.output_ids], self.block_size)
        seq = _Seq(job, hashes, ready=not job.remote_kv)
        prompt = len(job.prompt_ids)
        hit = self._hit_tokens(seq)
        self._counters["queries"] += prompt
        self._counters["hits"] += hit
        remote = 0
        if job.remote_kv:
            remote = prompt - hit
            self._counters["ext_queries"] += remote
            self._counters["ext_hits"] += remote
        self._seqs[job.id] = seq
        self._order.append(job.id)
        return Admission(hit, remote)

    def _hit_tokens(self, seq: _Seq) -> int:
        prompt = len(seq.job.prompt_ids)
        full = 0
        for h in seq.hashes:
            if h not in self._cached and h not in self._live_hashes():
                break
            full += 1
        # vLLM computes at least the last prompt token itself, to sample from its logits.
        return min(full * self.block_size, max(prompt - 1, 0))

    def _live_hashes(self) -> set[int]:
        live: set[int] = set()
        for s in self._seqs.values():
            live.update(s.hashes[: s.computed // self.block_size])
        return live

    def kv_arrived(self, job_id: str) -> None:
        seq = self._seqs.get(job_id)
        if seq is not None and not seq.ready:
            seq.ready = True

    def release_kv(self, job_id: str) -> None:
        seq = self._seqs.get(job_id)
        if seq is not None and seq.holding:
            self._free(seq)

    def abort(self, job_id: str) -> None:
        seq = self._seqs.get(job_id)
        if seq is not None:
            self._free(seq)

    def has_work(self) -> bool:
        return any(s.ready and not s.holding for s in self._seqs.values())

    def step(self) -> Tick:
        budget = self.config.max_batched_tokens
        tick = Tick(0.0)
        decode_ctx: list[int] = []
        plan: list[tuple[_Seq, int]] = []
        active = [self._seqs[i] for i in self._order if self._seqs[i].ready
                  and not self._seqs[i].holding]  # fmt: skip
        for seq in [s for s in active if not s.prefilling and s.blocks]:
            if len(plan) >= self.config.max_seqs:
                break
            if not self._grow(seq, seq.computed + 1):
                continue
            plan.append((seq, 1))
            decode_ctx.append(seq.computed + 1)
            budget -= 1
        for seq in [s for s in active if s.prefilling]:
            if budget <= 0 or len(plan) >= self.config.max_seqs:
                break
            if not seq.blocks:
                seq.computed = self._start_tokens(seq)
            n = min(seq.target - seq.computed, budget)
            if not self._grow(seq, seq.computed + n, preempt=False):
                if not self._in_use and not seq.blocks:
                    tick.failed[seq.job.id] = "prompt does not fit in the KV cache"
                    self._free(seq)
                break
            plan.append((seq, n))
            tick.prefill_tokens += n
            budget -= n
        tick.decode_seqs = len(decode_ctx)
        tick.duration_s = self.cost.step_s(tick.prefill_tokens, decode_ctx) if plan else 0.0
        for seq, n in plan:
            seq.computed += n
            if seq.prefilling:
                continue  # a chunk of a longer prompt: no token yet
            seq.emitted += 1
            tick.emitted[seq.job.id] = 1
            if seq.emitted >= len(seq.job.output_ids):
                tick.finished.append(seq.job.id)
                self._finish(seq)
        return tick

    def _start_tokens(self, seq: _Seq) -> int:
        """KV a job starts from: what arrived from P, else its prefix-cache hit."""
        if seq.job.remote_kv and seq.emitted == 0:
            return max(len(seq.job.prompt_ids) - 1, 0)  # D recomputes the last prompt token
        return min(self._hit_tokens(seq), max(seq.target - 1, 0))

    def _grow(self, seq: _Seq, tokens: int, preempt: bool = True) -> bool:
        """Hold enough blocks for `tokens`; evict cached blocks, then preempt the newest."""
        need = math.ceil(tokens / self.block_size) - seq.blocks
        while need > 0 and self._in_use + len(self._cached) + need > self.config.kv_blocks:
            if self._cached:
                self._cached.popitem(last=False)
                continue
            victims = [self._seqs[i] for i in reversed(self._order)
                       if self._seqs[i].blocks and self._seqs[i] is not seq
                       and not self._seqs[i].holding]  # fmt: skip
            if not preempt or not victims:
                return False
            self._preempt(victims[0])
        if need > 0:
            self._take_cached(seq, seq.blocks, seq.blocks + need)
            self._in_use += need
            seq.blocks += need
        return True

    def _take_cached(self, seq: _Seq, start: int, end: int) -> None:
        # A block a job (re)uses is live again, not a free cached block.
        for h in seq.hashes[start:end]:
            self._cached.pop(h, None)

    def _preempt(self, seq: _Seq) -> None:
        self._counters["preemptions"] += 1
        self._release(seq)
        seq.computed = 0  # recomputed (prompt and generated tokens) when rescheduled

    def _finish(self, seq: _Seq) -> None:
        if seq.job.hold_kv:
            seq.holding = True
        else:
            self._free(seq)

    def _free(self, seq: _Seq) -> None:
        self._release(seq)
        self._seqs.pop(seq.job.id, None)
        if seq.job.id in self._order:
            self._order.remove(seq.job.id)

    def _release(self, seq: _Seq) -> None:
        """Return a job's blocks; its computed full blocks stay findable as cached blocks."""
        for h in seq.hashes[: min(seq.computed // self.block_size, seq.blocks)]:
            self._cached[h] = None
            self._cached.move_to_end(h)
        self._in_use -= seq.blocks
        seq.blocks = 0

    def stats(self) -> EngineStats:
        running = sum(1 for s in self._seqs.values() if s.blocks and not s.holding)
        c = self._counters
        return EngineStats(
            running=running, waiting=len(self._seqs) - running - sum(
                1 for s in self._seqs.values() if s.holding),
            kv_usage=self._in_use / self.config.kv_blocks,
            prefix_queries=c["queries"], prefix_hits=c["hits"],
            external_queries=c["ext_queries"], external_hits=c["ext_hits"],
            preemptions=c["preemptions"],
        )  # fmt: skip
