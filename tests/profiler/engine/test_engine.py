"""The engine model against hand-computed cases (cost: 10 ms + 0.1 ms/prompt token +
1 ms/decoding request; see conftest)."""

from __future__ import annotations

import random

import pytest

from profiler.engine import (
    BatchShape,
    Engine,
    EngineConfig,
    Phase,
    Request,
    RequestRejected,
    SchedulePolicy,
    simulate,
)
from profiler.engine.prefix_cache import block_hashes
from proxy.shared.vocabulary import Role


def make(cost, **config) -> Engine:
    config.setdefault("block_size", 4)
    config.setdefault("num_kv_blocks", 100)
    config.setdefault("max_num_batched_tokens", 16)
    return Engine(EngineConfig(**config), cost)


def req(rid: str, prompt: int | list[int], max_tokens: int, **kw) -> Request:
    ids = list(range(prompt)) if isinstance(prompt, int) else prompt
    return Request(rid, max_tokens=max_tokens, prompt_token_ids=ids, **kw)


def test_one_request(cost):
    engine = make(cost)
    result = simulate(engine, [(0.0, req("a", 10, 3))])
    outcome = result.outcomes["a"]
    # prefill 10 tokens: 10 + 1.0 ms; then two decode steps of 10 + 1 ms each
    assert outcome.token_times == pytest.approx([0.011, 0.022, 0.033])
    assert outcome.ttft == pytest.approx(0.011)
    assert outcome.tpot == pytest.approx(0.011)
    assert outcome.finished and result.num_steps == 3
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (0, 0, 0.0)
    assert len(engine.sequence("a").output_token_ids) == 3


def test_two_overlapping_requests_share_steps_and_a_prefix(cost):
    engine = make(cost)
    result = simulate(engine, [(0.0, req("a", 10, 3)), (0.005, req("b", 20, 2))])
    a, b = result.outcomes["a"], result.outcomes["b"]
    # step 1 (0 -> 11 ms): a's prompt. b arrives mid-step and waits for step 2.
    # step 2 (11 -> 23.2 ms): a decodes (1 ms) + b's 12 uncached tokens (1.2 ms): b's first
    #   8 tokens are a's two full blocks, already in the prefix cache.
    # step 3 (23.2 -> 35.2 ms): both decode (2 ms).
    assert a.token_times == pytest.approx([0.011, 0.0232, 0.0352])
    assert b.token_times == pytest.approx([0.0232, 0.0352])
    assert b.num_cached_prompt == 8
    stats = engine.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (30, 8)


def test_a_prefill_chunk_joins_a_decode_batch(cost):
    engine = make(cost, max_num_batched_tokens=16, chunk_size=8)
    engine.submit(req("a", 4, 10), now=0.0)
    first = engine.step(0.0)
    assert first.shape == BatchShape(1, 4, 0, 0, 0)
    engine.submit(req("b", [100 + i for i in range(20)], 1), now=first.end)
    shapes = []
    while "b" not in (result := engine.step(engine.next_step_time())).tokens:
        shapes.append(result.shape)
    shapes.append(result.shape)
    # b's 20 prompt tokens go in chunks of 8, 8, 4, each beside a's one decode token;
    # a's context grows by one token per step.
    assert shapes == [BatchShape(1, 8, 0, 1, 5), BatchShape(1, 8, 8, 1, 6),
                      BatchShape(1, 4, 16, 1, 7)]
    assert result.duration == pytest.approx((10 + 0.4 + 1) / 1000)
    assert engine.sequence("b").first_token_time == pytest.approx(
        first.end + (10 + 0.8 + 1) * 2 / 1000 + (10 + 0.4 + 1) / 1000)


def test_decode_first_mixes_prefill_first_does_not(cost):
    def shapes(policy: SchedulePolicy) -> list[BatchShape]:
        engine = make(cost, policy=policy)
        engine.submit(req("a", 4, 3), now=0.0)
        engine.step(0.0)
        engine.submit(req("b", [100 + i for i in range(8)], 2), now=0.0)
        return [engine.step(0.0).shape for _ in range(2)]

    assert shapes(SchedulePolicy.DECODE_FIRST)[0] == BatchShape(1, 8, 0, 1, 5)
    assert shapes(SchedulePolicy.PREFILL_FIRST) == [BatchShape(1, 8, 0, 0, 0),
                                                    BatchShape(0, 0, 0, 2, 14)]


def test_an_evicted_prefix_is_recomputed(cost):
    def second_visit(other_tokens: int) -> tuple[int, float]:
        engine = make(cost, num_kv_blocks=6)
        arrivals = [(0.0, req("turn1", 16, 1)), (2.0, req("turn2", 16, 1))]
        if other_tokens:  # an unrelated request in between needs some of turn1's blocks
            arrivals.append((1.0, req("other", [1000 + i for i in range(other_tokens)], 1)))
        outcome = simulate(engine, arrivals).outcomes["turn2"]
        assert outcome.finished
        return outcome.num_cached_prompt, outcome.ttft

    # Kept: 3 of turn1's 4 blocks are reused (the last prompt token is always computed).
    assert second_visit(0) == (12, pytest.approx((10 + 0.4) / 1000))
    # 20 tokens take 5 of 6 blocks: 3 of turn1's go, tail first, so its first block survives.
    assert second_visit(20) == (4, pytest.approx((10 + 1.2) / 1000))
    # 23 tokens take all 6 blocks: turn 2 recomputes its whole prompt.
    assert second_visit(23) == (0, pytest.approx((10 + 1.6) / 1000))


def test_preemption_recomputes_and_every_request_still_finishes(cost):
    # 4 blocks of 4 tokens: two requests of 6 prompt tokens growing to 10 cannot both fit.
    engine = make(cost, num_kv_blocks=4)
    b_prompt = [50 + i for i in range(6)]
    result = simulate(engine, [(0.0, req("a", 6, 4)), (0.0, req("b", b_prompt, 4))])
    assert all(o.finished for o in result.outcomes.values())
    assert engine.stats().num_preemptions >= 1
    assert engine.sequence("b").num_preemptions >= 1
    assert [len(engine.sequence(r).output_token_ids) for r in "ab"] == [4, 4]


def test_determinism_with_a_seed(cost):
    def run(seed: int):
        rng = random.Random(7)
        engine = make(cost, num_kv_blocks=40, seed=seed)
        arrivals = [(rng.uniform(0, 0.5), req(f"r{i}", rng.randint(1, 60), rng.randint(1, 20)))
                    for i in range(40)]
        result = simulate(engine, arrivals)
        times = {k: o.token_times for k, o in result.outcomes.items()}
        ids = {k: engine.sequence(k).output_token_ids for k in result.outcomes}
        return times, ids

    assert run(1) == run(1)
    assert run(1)[0] == run(2)[0]  # the seed only draws token ids
    assert run(1)[1] != run(2)[1]


def test_conservation_every_request_finishes_or_fails(cost):
    rng = random.Random(3)
    engine = make(cost, num_kv_blocks=30, max_model_len=100)
    arrivals = [(rng.uniform(0, 1), req(f"r{i}", rng.randint(1, 70), rng.randint(1, 30)))
                for i in range(200)]
    arrivals.append((0.5, req("too-long", 90, 20)))  # 110 > max_model_len
    result = simulate(engine, arrivals)
    assert len(result.outcomes) == 201
    finished = [o for o in result.outcomes.values() if o.finished]
    failed = [o for o in result.outcomes.values() if o.error]
    assert len(finished) + len(failed) == 201
    assert [o.id for o in failed] == ["too-long"]
    assert "max_model_len" in (failed[0].error or "")
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_waiting_kv) == (0, 0, 0)
    assert stats.kv_usage == 0.0
    assert stats.num_preemptions > 0  # the cache is small enough to force some


def test_prefill_node_holds_kv_until_released(cost):
    engine = make(cost, role=Role.PREFILL, num_kv_blocks=10)
    engine.submit(req("p", 10, 1, send_kv=True), now=0.0)
    result = engine.step(0.0)
    assert result.finished == ("p",)
    assert engine.stats().kv_usage == pytest.approx(0.3)  # 3 blocks kept for the D
    engine.release_kv("p")
    assert engine.stats().kv_usage == 0.0
    with pytest.raises(ValueError, match="holds no KV"):
        engine.release_kv("p")


def test_decode_node_pulls_kv_then_decodes(cost):
    engine = make(cost, role=Role.DECODE)
    engine.submit(req("warm", 8, 1), now=0.0)
    engine.step(0.0)  # caches the first 8 tokens (2 blocks)
    engine.submit(req("d", 14, 2, kv_from="p0"), now=1.0)
    admitted = engine.step(1.0)
    # Only the 6 tokens beyond D's own cache are pulled; nothing is computed meanwhile.
    assert admitted.kv_pulls == (("d", 6),) and admitted.shape.is_empty
    assert engine.sequence("d").phase is Phase.WAITING_KV
    assert engine.next_step_time() is None
    engine.kv_arrived("d")
    first = engine.step(1.5)
    # The last prompt token is recomputed to sample the first output: a decode-shaped step.
    assert first.shape == BatchShape(0, 0, 0, 1, 14) and "d" in first.tokens
    assert first.end == pytest.approx(1.5 + 0.011)
    stats = engine.stats()
    assert (stats.prefix_cache_hits, stats.external_prefix_cache_hits) == (8, 6)
    assert stats.external_prefix_cache_queries == 14


def test_rejections_and_abort(cost):
    engine = make(cost, role=Role.PREFILL, num_kv_blocks=4)
    with pytest.raises(RequestRejected, match="KV cache"):
        engine.submit(req("big", 16, 4), now=0.0)
    with pytest.raises(RequestRejected, match="does not receive KV"):
        engine.submit(req("d", 4, 1, kv_from="p"), now=0.0)
    with pytest.raises(RequestRejected, match="max_tokens"):
        req("zero", 4, 0)
    engine.submit(req("a", 8, 4), now=0.0)
    engine.step(0.0)
    engine.abort("a", now=0.1, reason="client gone")
    seq = engine.sequence("a")
    assert (seq.phase, seq.error) == (Phase.FAILED, "client gone")
    assert engine.stats().kv_usage == 0.0 and engine.next_step_time() is None
    assert engine.forget("a") is seq
    with pytest.raises(KeyError):
        engine.sequence("a")


def test_output_tokens_extend_the_prefix_cache(cost):
    # Turn 2's prompt is turn 1's prompt + its outputs + new tokens: the outputs hit too.
    engine = make(cost)
    simulate(engine, [(0.0, req("t1", 8, 9))])
    history = list(range(8)) + engine.sequence("t1").output_token_ids
    result = simulate(engine, [(1.0, req("t2", history + [7, 7, 7], 1))])
    assert result.outcomes["t2"].num_cached_prompt == 16  # blocks 0-3 complete; block 4 not


def test_given_output_ids_are_emitted_and_cached(cost):
    engine = make(cost)
    answer = [900 + i for i in range(9)]
    simulate(engine, [(0.0, req("t1", 8, 9, output_token_ids=answer))])
    assert engine.sequence("t1").output_token_ids == answer
    turn2 = list(range(8)) + answer + [7, 7, 7]
    result = simulate(engine, [(1.0, req("t2", turn2, 1))])
    assert result.outcomes["t2"].num_cached_prompt == 16
    with pytest.raises(ValueError, match="output token ids"):
        req("short", 4, 3, output_token_ids=[1, 2])


def test_a_request_blocked_by_held_kv_waits_without_spinning(cost):
    # P keeps a finished request's 3 blocks for its D; the next prompt needs 3 of the 4.
    engine = make(cost, role=Role.PREFILL, num_kv_blocks=4)
    engine.submit(req("first", 10, 1, send_kv=True), now=0.0)
    engine.step(0.0)
    engine.submit(req("second", [100 + i for i in range(10)], 1, send_kv=True), now=0.1)
    blocked = engine.step(0.1)
    assert blocked.shape.is_empty and blocked.duration == 0.0
    assert engine.next_step_time() is None  # nothing can change until the D reads the KV
    engine.release_kv("first")
    assert engine.next_step_time() is not None
    assert engine.step(0.2).finished == ("second",)


def test_abort_in_every_queue_frees_every_block(cost):
    engine = make(cost, role=Role.DECODE, num_kv_blocks=20)
    engine.submit(req("running", 8, 5), now=0.0)
    engine.submit(req("pulling", [100 + i for i in range(8)], 5, kv_from="p"), now=0.0)
    engine.step(0.0)
    engine.submit(req("queued", [200 + i for i in range(8)], 5), now=0.0)
    phases = {rid: engine.sequence(rid).phase for rid in ("running", "pulling", "queued")}
    assert phases == {"running": Phase.RUNNING, "pulling": Phase.WAITING_KV,
                      "queued": Phase.WAITING}
    for rid in phases:
        engine.abort(rid, now=0.5)
        assert engine.sequence(rid).phase is Phase.FAILED
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_waiting_kv) == (0, 0, 0)
    assert stats.kv_usage == 0.0 and engine.next_step_time() is None


def test_a_cache_observer_hears_every_store_and_eviction(cost):
    heard_stored: list[tuple[int, int, list[int], str]] = []
    heard_removed: list[list[int]] = []

    class Observer:
        def stored(self, block_hash, parent, token_ids, request_id) -> None:
            heard_stored.append((block_hash, parent, list(token_ids), request_id))

        def removed(self, block_hashes) -> None:
            heard_removed.append(list(block_hashes))

    engine = Engine(EngineConfig(block_size=4, num_kv_blocks=6, max_num_batched_tokens=32),
                    cost, cache_observer=Observer())
    ids = list(range(16))
    chain = block_hashes(ids, 4)
    simulate(engine, [(0.0, req("turn1", ids, 1))])
    # Four full prompt blocks, chained from the root, each with its tokens and its request.
    parents = [0, *chain[:-1]]
    assert heard_stored == [(chain[i], parents[i], ids[4 * i:4 * i + 4], "turn1")
                            for i in range(4)]
    assert heard_removed == []
    # The same prompt again hits the cache: nothing new is stored.
    simulate(engine, [(1.0, req("again", ids, 1))])
    assert len(heard_stored) == 4
    # 20 other tokens take 5 of 6 blocks: 3 of turn1's are evicted, tail first, in one call.
    other = [1000 + i for i in range(20)]
    simulate(engine, [(2.0, req("other", other, 1))])
    assert heard_removed == [[chain[3], chain[2], chain[1]]]
    assert [s[3] for s in heard_stored[4:]] == ["other"] * 5
    assert [s[0] for s in heard_stored[4:]] == block_hashes(other, 4)


def test_output_blocks_are_stored_with_their_token_ids(cost):
    stored: list[tuple[int, list[int]]] = []

    class Observer:
        def stored(self, block_hash, parent, token_ids, request_id) -> None:
            stored.append((parent, list(token_ids)))

        def removed(self, block_hashes) -> None:
            raise AssertionError("nothing is evicted here")

    engine = Engine(EngineConfig(block_size=4, num_kv_blocks=100, max_num_batched_tokens=16),
                    cost, cache_observer=Observer())
    answer = [900 + i for i in range(9)]
    simulate(engine, [(0.0, req("t1", 6, 9, output_token_ids=answer))])
    # 6 prompt + 9 outputs, the last never computed: 14 tokens of KV, 3 full blocks, the
    # second and third spanning prompt and reply.
    assert [tokens for _, tokens in stored] == [[0, 1, 2, 3], [4, 5, 900, 901],
                                                [902, 903, 904, 905]]
