"""Two engines and a link, driven by hand the way a P/D cluster would drive them: turn 2 of a
conversation served P->D (full re-prefill on P, KV moved, one step on D) against local
append-prefill on the D that holds turn 1."""

from __future__ import annotations

import pytest

from profiler.engine import (
    Engine,
    EngineConfig,
    Link,
    Request,
    SharedLink,
    load_link,
    load_model_shape,
)
from proxy.shared.vocabulary import Role

TURN1_IN, TURN1_OUT, TURN2_IN = 1024, 64, 1024


def run_until_token(engine: Engine, request_id: str, now: float) -> float:
    """Step an engine until the request has a token; the time it appears."""
    while True:
        start = engine.next_step_time()
        assert start is not None, "the engine stalled"
        result = engine.step(max(now, start))
        now = result.end
        if request_id in result.tokens:
            return now


def turn2_ttft(cost, link: Link, *, local: bool) -> float:
    bytes_per_token = load_model_shape("llama-3.1-8b").kv_bytes_per_token
    prefill = Engine(EngineConfig(role=Role.PREFILL), cost)
    decode = Engine(EngineConfig(role=Role.DECODE), cost)
    wire = SharedLink(link)

    def p_to_d(rid: str, prompt: list[int], max_tokens: int, now: float) -> float:
        prefill.submit(Request(rid + "@p", max_tokens=1, prompt_token_ids=prompt,
                               send_kv=True), now)
        now = run_until_token(prefill, rid + "@p", now)
        decode.submit(Request(rid, max_tokens=max_tokens, prompt_token_ids=prompt,
                              kv_from="p"), now)
        pulls = decode.step(now).kv_pulls
        assert [pull_id for pull_id, _ in pulls] == [rid]
        wire.start(rid, pulls[0][1] * bytes_per_token, now)
        now = wire.next_completion() or now
        wire.advance(now)
        prefill.release_kv(rid + "@p")
        decode.kv_arrived(rid)
        return run_until_token(decode, rid, now)

    turn1 = list(range(TURN1_IN))
    now = p_to_d("t1", turn1, TURN1_OUT, 0.0)
    while decode.next_step_time() is not None:  # finish turn 1's answer
        now = decode.step(max(now, decode.next_step_time() or now)).end
    history = turn1 + decode.sequence("t1").output_token_ids
    turn2 = history + [50_000 + i for i in range(TURN2_IN)]
    start = now + 1.0
    if local:
        decode.submit(Request("t2", max_tokens=8, prompt_token_ids=turn2), start)
        first = run_until_token(decode, "t2", start)
        # the KV of turn 1's last output token was never computed: 1087 tokens, 67 blocks
        assert decode.sequence("t2").num_cached_prompt == (len(history) - 1) // 16 * 16
    else:
        first = p_to_d("t2", turn2, 8, start)
    return first - start


def test_turn2_by_hand(cost):
    link = Link("test", 1e9, 0.0, "hand")  # 1 GB/s: 128 KiB per token takes 131 us
    local = turn2_ttft(cost, link, local=True)
    pd = turn2_ttft(cost, link, local=False)
    # local: D holds 67 full blocks of turn 1 (1072 tokens): 2112 - 1072 = 1040 to compute
    assert local == pytest.approx((10 + 0.1 * 1040) / 1000)
    # P->D: P holds turn 1's prompt (64 blocks, 1024 tokens): computes 1088 tokens; the KV
    # D lacks (2112 - 1072 = 1040 tokens) crosses the link; then D's one-token step.
    p_step = (10 + 0.1 * 1088) / 1000
    transfer = 1040 * 131072 / 1e9
    d_step = (10 + 1) / 1000
    assert pd == pytest.approx(p_step + transfer + d_step)


def test_turn2_on_h100_local_beats_pd(h100):
    nvlink = load_link("nvlink")
    local = turn2_ttft(h100, nvlink, local=True)
    pd = turn2_ttft(h100, nvlink, local=False)
    # Unloaded, a 1040-token append-prefill after 1072 cached tokens: ~25 ms on an H100.
    # P->D computes 48 tokens more, moves 130 MiB over NVLink (0.3 ms) and adds D's
    # one-token step (~6 ms: a decode step reads all 16 GB of weights).
    assert 0.015 < local < 0.035
    assert 0.005 < pd - local < 0.012


def test_a_readback_p_computes_only_what_it_did_not_read(cost):
    # P read the first 1000 prompt tokens' KV from a D (`preloaded`): like a prefix-cache hit,
    # it computes the other 24, and counts the 1000 as external hits.
    prefill = Engine(EngineConfig(role=Role.PREFILL), cost)
    prompt = list(range(1024))
    prefill.submit(Request("rb", max_tokens=1, prompt_token_ids=prompt, send_kv=True,
                           preloaded=1000), 0.0)
    result = prefill.step(0.0)
    assert result.end == pytest.approx((10 + 0.1 * 24) / 1000)
    assert prefill.stats().external_prefix_cache_hits == 1000
    # Never the whole prompt: the last token is computed to sample from (a one-token step,
    # priced as D's one-token step above).
    whole = Engine(EngineConfig(role=Role.PREFILL), cost)
    whole.submit(Request("all", max_tokens=1, prompt_token_ids=prompt, preloaded=5000), 0.0)
    assert whole.step(0.0).end == pytest.approx((10 + 1) / 1000)
