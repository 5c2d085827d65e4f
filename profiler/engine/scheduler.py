"""Which requests run in the next step and how many tokens each computes (vLLM v1's shape).

Every request has computed `num_computed` of its `num_tokens` (prompt + outputs so far); a
step gives it up to `num_tokens - num_computed` more - a prompt chunk, or the one token of a
decode - within the step's token budget. Blocks come from the `PrefixCache`; when a running
request cannot grow, the most recently admitted one is preempted and recomputed later, as
vLLM does by default.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from profiler.engine.config import EngineConfig, SchedulePolicy
from profiler.engine.prefix_cache import ROOT_HASH, CacheObserver, PrefixCache, hash_block
from profiler.engine.requests import Phase, Sequence

ScheduledItem = tuple[Sequence, int]  # (request, tokens it computes this step)


class Scheduler:
    def __init__(self, config: EngineConfig, cache_observer: CacheObserver | None = None) -> None:
        self.config = config
        self.cache = PrefixCache(config.num_kv_blocks, cache_observer)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.waiting_kv: dict[str, Sequence] = {}
        self._admit_until = float("inf")  # schedule()'s cut-off for waiting arrivals
        self.preempted: list[str] = []  # ids preempted by the last schedule()
        self.kv_pulls: list[tuple[str, int]] = []  # (id, tokens to pull) admitted last time
        # Counters in vLLM's metric terms (tokens).
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.external_queries = 0
        self.external_hits = 0

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- scheduling -------------------------------------------------------------------------

    def schedule(self, admit_until: float = float("inf")) -> list[ScheduledItem]:
        """The next step's batch. Waiting requests that arrived after `admit_until` are left
        for a later step (vLLM's async scheduling planned this step before they came), unless
        the step would otherwise run nothing."""
        self.preempted = []
        self.kv_pulls = []
        self._admit_until = admit_until
        budget = self.config.max_num_batched_tokens
        if self.config.policy is SchedulePolicy.PREFILL_FIRST:
            batch = self._schedule_prefills(budget)
            batch = batch if batch else self._schedule_running(budget, decode_only=True)[0]
        else:
            batch, budget = self._schedule_running(budget)
            batch += self._schedule_waiting(budget)
        if not batch and not self.kv_pulls and self.waiting and admit_until != float("inf"):
            return self.schedule()  # an idle GPU: vLLM schedules the newcomers at once
        return batch

    def _schedule_prefills(self, budget: int) -> list[ScheduledItem]:
        """nano-vllm: ongoing prompt chunks, then new prompts; no decodes in the step."""
        batch, budget = self._schedule_running(budget, prefill_only=True)
        return batch + self._schedule_waiting(budget)

    def _schedule_running(self, budget: int, *, decode_only: bool = False,
                          prefill_only: bool = False) -> tuple[list[ScheduledItem], int]:
        """The running requests' work in order, and the budget left."""
        batch: list[ScheduledItem] = []
        running = self.running
        block_size = self.config.block_size
        index = 0
        while index < len(running) and budget > 0:
            seq = running[index]
            pending = seq.num_prompt + len(seq.output_token_ids) - seq.num_computed
            is_decode = pending == 1 and seq.num_computed > 0
            if is_decode and not prefill_only:
                # The hot path: one token; a new block only at a block boundary.
                # (Sequence.num_blocks_held inlined: this runs once per request per step.)
                if seq.num_computed >= (len(seq.held_hashes) + seq.anon_blocks) * block_size \
                        and not self._make_room(seq, seq.num_computed + 1):
                    break
                batch.append((seq, 1))
                budget -= 1
                index += 1
                continue
            if is_decode or decode_only:  # not this step's kind of work
                index += 1
                continue
            tokens = self._tokens_for(seq, budget)
            if not self._make_room(seq, seq.num_computed + tokens):
                break  # seq itself was preempted, and everything after it already was
            batch.append((seq, tokens))
            budget -= tokens
            index += 1
        return batch, budget

    def _schedule_waiting(self, budget: int) -> list[ScheduledItem]:
        batch: list[ScheduledItem] = []
        if self.preempted:
            return batch  # vLLM admits nothing in a step that had to preempt: no thrashing
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if seq.arrival > self._admit_until:
                break  # came after this step was planned
            if seq.request.kv_from is not None and not seq.kv_received:
                if not self._admit_for_pull(seq):
                    break
                continue
            if budget <= 0:
                break
            fresh = not seq.num_blocks_held
            if fresh:
                self._take_prefix_hit(seq)
            tokens = self._tokens_for(seq, budget)
            if not self._grow(seq, seq.num_computed + tokens):
                if fresh:
                    self._drop_blocks(seq)
                break
            self.waiting.popleft()
            seq.phase = Phase.RUNNING
            self.running.append(seq)
            batch.append((seq, tokens))
            budget -= tokens
        return batch

    def _make_room(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow seq's blocks to num_tokens, preempting the newest running requests (never one
        already scheduled this step: they sit before seq); False if seq itself had to go."""
        while not self._grow(seq, num_tokens):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _tokens_for(self, seq: Sequence, budget: int) -> int:
        tokens = min(seq.num_tokens - seq.num_computed, budget)
        if self.config.chunk_size is not None:
            tokens = min(tokens, self.config.chunk_size)
        return tokens

    # -- P->D: a D request allocates its prompt's blocks, then waits for the KV ------------

    def _admit_for_pull(self, seq: Sequence) -> bool:
        self._take_prefix_hit(seq)
        if not self._grow(seq, seq.num_prompt):
            self._drop_blocks(seq)
            return False
        self.waiting.popleft()
        seq.phase = Phase.WAITING_KV
        self.waiting_kv[seq.id] = seq
        seq.num_external = seq.num_prompt - seq.num_computed
        self.external_queries += seq.num_prompt
        self.kv_pulls.append((seq.id, seq.num_external))
        return True

    def kv_arrived(self, seq: Sequence) -> None:
        """The prompt's KV is in: cache its full blocks; the last prompt token is recomputed
        to sample the first output (vLLM does the same), so the request queues to decode."""
        del self.waiting_kv[seq.id]
        self.external_hits += seq.num_external
        seq.kv_received = True
        seq.num_computed = seq.num_prompt
        self.register_full_blocks(seq)
        seq.num_computed = seq.num_prompt - 1
        seq.phase = Phase.WAITING
        self.waiting.appendleft(seq)

    # -- blocks ------------------------------------------------------------------------------

    def _take_prefix_hit(self, seq: Sequence) -> None:
        """Reuse the longest cached prefix; at least one prompt token is always computed."""
        bs = self.config.block_size
        usable = (seq.num_tokens - 1) // bs
        hit = self.cache.longest_prefix(self._hashes(seq, usable))
        hashes = seq.block_hashes[:hit]
        self.cache.acquire(hashes)
        seq.held_hashes = list(hashes)
        seq.num_computed = hit * bs
        if not seq.num_preemptions:
            self.prefix_queries += seq.num_prompt
            self.prefix_hits += seq.num_computed
            seq.num_cached_prompt = seq.num_computed
            # A readback: the tokens read from another node are in; the rest is computed
            # (at least the last prompt token, to sample from). A preempted request lost them.
            read = min(seq.request.preloaded, seq.num_prompt - 1)
            if read > seq.num_computed:
                self.external_queries += read - seq.num_computed
                self.external_hits += read - seq.num_computed
                seq.num_computed = read

    def _grow(self, seq: Sequence, num_tokens: int) -> bool:
        bs = self.config.block_size
        needed = -(-num_tokens // bs) - seq.num_blocks_held
        if needed <= 0:
            return True
        if not self.cache.allocate(needed):
            return False
        seq.anon_blocks += needed
        return True

    def register_full_blocks(self, seq: Sequence) -> None:
        """Hash the blocks the request's computed tokens filled, so others can hit them."""
        full = seq.num_computed // self.config.block_size
        observer = self.cache.observer
        first = len(seq.held_hashes)
        if observer is None and first < full:
            # Blocks whose hashes are known already (the prompt's) in one pass: a P->D
            # request's whole prompt when its KV arrives; no observer to tell block by block.
            known = seq.block_hashes[first:full]
            self.cache.register_all(known)
            seq.held_hashes.extend(known)
            seq.anon_blocks -= len(known)
            first += len(known)
        for index in range(first, full):
            block_hash = self._block_hash(seq, index)
            if block_hash is None:
                return
            if self.cache.register(block_hash) and observer is not None:
                parent = seq.block_hashes[index - 1] if index else ROOT_HASH
                observer.stored(block_hash, parent, self._block_tokens(seq, index), seq.id)
            seq.held_hashes.append(block_hash)
            seq.anon_blocks -= 1

    def _block_tokens(self, seq: Sequence, index: int) -> list[int]:
        """The token ids of seq's index-th full block (none for a request given by hashes)."""
        prompt_ids = seq.request.prompt_token_ids
        if prompt_ids is None:
            return []
        bs = self.config.block_size
        start, end = index * bs, (index + 1) * bs
        num_prompt = seq.num_prompt
        if end <= num_prompt:
            return list(prompt_ids[start:end])
        if start >= num_prompt:
            return seq.output_token_ids[start - num_prompt:end - num_prompt]
        return list(prompt_ids[start:]) + seq.output_token_ids[:end - num_prompt]

    def _hashes(self, seq: Sequence, count: int) -> Iterator[int]:
        for index in range(count):
            block_hash = self._block_hash(seq, index)
            if block_hash is None:
                return
            yield block_hash

    def _block_hash(self, seq: Sequence, index: int) -> int | None:
        """Hash of the seq's index-th full block; None when its tokens are unknown (a request
        given by block hashes only has none beyond its prompt's)."""
        if index < len(seq.block_hashes):
            return seq.block_hashes[index]
        prompt_ids = seq.request.prompt_token_ids
        if prompt_ids is None or index != len(seq.block_hashes):
            return None
        if (index + 1) * self.config.block_size > seq.num_tokens:
            return None
        parent = seq.block_hashes[-1] if seq.block_hashes else ROOT_HASH
        block_hash = hash_block(parent, self._block_tokens(seq, index))
        seq.block_hashes.append(block_hash)
        return block_hash

    def free(self, seq: Sequence) -> None:
        self._drop_blocks(seq)

    def drop(self, seq: Sequence) -> None:
        """Take an unfinished request out of whichever queue holds it and free its blocks."""
        if seq.phase is Phase.WAITING_KV:
            del self.waiting_kv[seq.id]
        elif seq.phase is Phase.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self._drop_blocks(seq)

    def _drop_blocks(self, seq: Sequence) -> None:
        self.cache.release(seq.held_hashes, seq.anon_blocks)
        seq.held_hashes = []
        seq.anon_blocks = 0
        seq.num_computed = 0

    def _preempt(self, seq: Sequence) -> None:
        """Recompute preemption: drop its blocks (they stay cached while nobody evicts them)
        and requeue it at the front, outputs kept."""
        self.running.remove(seq)
        self._drop_blocks(seq)
        seq.phase = Phase.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        self.preempted.append(seq.id)
