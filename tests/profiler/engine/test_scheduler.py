"""The engine's scheduler alone: the token budget, chunking, decode-first order, the batch
limit, and preemption when the KV cache is full (vLLM v1's behaviour, docs/engine-model.md)."""

from __future__ import annotations

from profiler.engine.config import EngineConfig, SchedulePolicy
from profiler.engine.prefix_cache import block_hashes
from profiler.engine.requests import Phase, Request, Sequence
from profiler.engine.scheduler import Scheduler


def _queue(scheduler: Scheduler, name: str, prompt: int, max_tokens: int = 4) -> Sequence:
    ids = [hash((name, i)) % 50_000 for i in range(prompt)]
    seq = Sequence(Request(name, max_tokens, prompt_token_ids=ids), 0.0,
                   block_hashes(ids, scheduler.config.block_size))
    scheduler.waiting.append(seq)
    return seq


def _step(scheduler: Scheduler) -> dict[str, int]:
    """One schedule; the tokens computed are recorded, and a finished prompt emits a token."""
    batch = scheduler.schedule()
    for seq, tokens in batch:
        seq.num_computed += tokens
        if seq.num_computed >= seq.num_tokens:
            seq.output_token_ids.append(1)
    return {seq.id: tokens for seq, tokens in batch}


def test_a_long_prompt_is_chunked_by_the_token_budget() -> None:
    scheduler = Scheduler(EngineConfig(max_num_batched_tokens=64, block_size=16))
    _queue(scheduler, "a", 150)
    assert [_step(scheduler) for _ in range(3)] == [{"a": 64}, {"a": 64}, {"a": 22}]
    assert _step(scheduler) == {"a": 1}  # then one decode token per step


def test_decodes_go_first_and_new_prompts_take_what_is_left() -> None:
    scheduler = Scheduler(EngineConfig(max_num_batched_tokens=64, block_size=16))
    _queue(scheduler, "a", 32)
    _step(scheduler)
    _queue(scheduler, "b", 100)
    assert _step(scheduler) == {"a": 1, "b": 63}


def test_prefill_first_runs_no_decode_beside_a_prompt() -> None:
    config = EngineConfig(max_num_batched_tokens=64, block_size=16,
                          policy=SchedulePolicy.PREFILL_FIRST)
    scheduler = Scheduler(config)
    _queue(scheduler, "a", 32)
    _step(scheduler)
    _queue(scheduler, "b", 40)
    assert _step(scheduler) == {"b": 40}
    assert _step(scheduler) == {"a": 1, "b": 1}


def test_the_batch_limit_keeps_requests_waiting() -> None:
    scheduler = Scheduler(EngineConfig(max_num_seqs=2, block_size=16))
    for name in "abc":
        _queue(scheduler, name, 16)
    assert set(_step(scheduler)) == {"a", "b"}
    assert [seq.id for seq in scheduler.waiting] == ["c"]


def test_a_full_cache_preempts_the_newest_running_request() -> None:
    # Four blocks of 16 tokens: two 32-token prompts fill them; the first decode needs a fifth.
    scheduler = Scheduler(EngineConfig(num_kv_blocks=4, block_size=16))
    first, second = _queue(scheduler, "a", 32), _queue(scheduler, "b", 32)
    assert _step(scheduler) == {"a": 32, "b": 32}
    assert _step(scheduler) == {"a": 1}
    assert scheduler.preempted == ["b"]
    assert second.phase is Phase.WAITING and second.num_computed == 0
    assert first.phase is Phase.RUNNING and second.num_preemptions == 1
