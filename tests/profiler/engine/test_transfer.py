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
    simulate,
)
from proxy.shared.vocabulary import Role


def test_kv_bytes_per_token_from_the_model_shape():
    # Llama-3.1-8B: 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes (bf16) = 128 KiB
    assert load_model_shape("llama-3.1-8b").kv_bytes_per_token == 131072
    with pytest.raises(ValueError, match="unknown model"):
        load_model_shape("gpt-5")


def test_link_presets_have_sources():
    for name in ("nvlink", "rdma-400g", "tcp-25g"):
        link = load_link(name)
        assert link.bandwidth_bytes_per_s > 0 and link.source
    # 2k tokens of Llama-3.1-8B (256 MiB) over 400G RDMA: ~5.4 ms
    assert load_link("rdma-400g").transfer_time(2048 * 131072) == pytest.approx(
        10e-6 + 2048 * 131072 / 50e9)
    with pytest.raises(ValueError, match="unknown link"):
        load_link("carrier-pigeon")


def test_transfers_share_a_link_fairly():
    link = SharedLink(Link("test", 1000.0, 0.0, "hand"))
    link.start("a", 1000, now=0.0)
    assert link.next_completion() == pytest.approx(1.0)  # alone: 1000 B at 1000 B/s
    link.start("b", 250, now=0.5)
    # From 0.5 s each moves 500 B/s: b's 250 B take 0.5 s; a has 500 - 250 = 250 B left,
    # alone again at 1000 B/s: 0.25 s more.
    assert link.next_completion() == pytest.approx(1.0)
    assert link.advance(1.0) == ["b"]
    assert link.next_completion() == pytest.approx(1.25)
    assert link.advance(2.0) == ["a"]
    assert link.next_completion() is None and len(link) == 0


def test_latency_comes_before_the_bytes_and_does_not_take_a_share():
    link = SharedLink(Link("test", 1000.0, 0.1, "hand"))
    link.start("a", 100, now=0.0)
    link.start("b", 100, now=0.0)
    # both wait 0.1 s, then share: 200 B at 1000 B/s
    assert link.next_completion() == pytest.approx(0.3)
    assert sorted(link.advance(0.3)) == ["a", "b"]
    link.start("c", 1, now=0.3)
    with pytest.raises(ValueError, match="already"):
        link.start("c", 1, now=0.3)


def test_a_decode_waits_for_its_transfer(cost):
    engine = Engine(EngineConfig(role=Role.DECODE, block_size=4, num_kv_blocks=100), cost)
    link = SharedLink(Link("test", 1000.0, 0.0, "hand"))
    request = Request("d", max_tokens=2, prompt_token_ids=list(range(10)), kv_from="p")
    result = simulate(engine, [(0.0, request)], link=link, kv_bytes_per_token=10)
    outcome = result.outcomes["d"]
    # 10 tokens x 10 B at 1000 B/s = 0.1 s, then two decode-shaped steps of 11 ms
    assert outcome.token_times == pytest.approx([0.111, 0.122])
    assert link.bytes_moved == 100
    assert engine.stats().external_prefix_cache_hits == 10


def test_a_cancelled_transfer_stops_sharing_and_its_unsent_bytes_do_not_count():
    link = SharedLink(Link("test", 1000.0, 0.1, "hand"))
    link.start("a", 1000, now=0.0)
    link.start("b", 1000, now=0.0)
    link.start("c", 500, now=0.0)
    link.cancel("c", now=0.05)  # still in its latency: none of its bytes moved
    link.cancel("b", now=0.6)  # 250 of its bytes moved at half the bandwidth
    assert link.bytes_moved == pytest.approx(1250)
    # a: 250 B by 0.6 s, then 750 B alone at 1000 B/s
    assert link.next_completion() == pytest.approx(1.35)
    assert link.advance(1.35) == ["a"] and len(link) == 0
