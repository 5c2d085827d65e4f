"""Through the proxy on a real 1P2D vLLM cluster (NIXL): concurrent conversations are spread over
both D nodes and each keeps its D for all of its turns (checked in headers and in vLLM's
counters); then a D dies before it pulls a prefilled prompt: the proxy redoes the turn on the
other D, and P frees the orphaned blocks when their lease ends (vLLM's kv_lease_duration)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from profiler.cluster.launcher import Cluster
from proxy.shared.vocabulary import Role
from tests.e2e.support import (
    EXPIRED_LEASES,
    EXTERNAL_HITS,
    KV_LEASE_S,
    PREFIX_HITS,
    PROMPT_TOKENS,
    REQUESTS,
    Conversation,
    Turn,
    counters,
    delta,
    filler,
    proxy_for,
    sample_sum,
    wait_for_kv_usage_zero,
)

TURNS = 3


@pytest.fixture(scope="module")
def local_proxy(cluster_1p2d: Cluster, tiny_model: Path) -> Iterator[str]:
    with proxy_for(cluster_1p2d, "local", tiny_model) as url:
        yield url


def test_two_concurrent_conversations_spread_over_both_d_and_stick(
    cluster_1p2d: Cluster, local_proxy: str
) -> None:
    p_url = cluster_1p2d.url(Role.PREFILL)
    d_urls = cluster_1p2d.urls(Role.DECODE)
    assert len(d_urls) == 2
    before = {url: counters(url) for url in [p_url, *d_urls]}
    start = threading.Barrier(2)  # both first turns are in flight together

    def converse(seed: int) -> list[Turn]:
        chat = Conversation(local_proxy, "tiny", f"spread-{seed}")
        start.wait(timeout=60)
        return [chat.say(filler(300 if t == 0 else 30, seed=seed * 10 + t)) for t in range(TURNS)]

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(converse, (1, 2))

    for turns in (a, b):
        assert [t.turn for t in turns] == [1, 2, 3]
        assert [t.route for t in turns] == ["pd", "local", "local"]
        assert len({t.decode for t in turns}) == 1  # sticks to its D
    assert {a[0].decode, b[0].decode} == set(d_urls)  # spread over both

    changes = {url: delta(before[url], counters(url)) for url in before}
    assert changes[p_url][REQUESTS] == 2  # only the two first turns touched P
    for url in d_urls:
        assert changes[url][REQUESTS] == TURNS  # all turns of one conversation, none of the other
        assert changes[url][PREFIX_HITS] > 0  # its later turns reused its cached history


def test_d_dead_before_its_pull_turn_redone_on_the_other_d_and_p_frees_the_blocks(
    cluster_1p2d: Cluster, tiny_model: Path
) -> None:
    """Runs last in this module: it kills a D of the shared cluster."""
    p_url = cluster_1p2d.url(Role.PREFILL)
    # Health checks far apart: the proxy must learn of the death from the failed D leg itself.
    with proxy_for(cluster_1p2d, "pd", tiny_model, "--health-interval", "600") as proxy:
        chat = Conversation(proxy, "tiny", "orphan")
        first = chat.say(filler(300, seed=91))
        victim = first.decode
        survivor = next(url for url in cluster_1p2d.urls(Role.DECODE) if url != victim)
        node = next(n for n in cluster_1p2d.nodes if n.url == victim)
        os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.process.wait(timeout=30)  # type: ignore[union-attr]
        wait_for_kv_usage_zero(p_url, timeout_s=KV_LEASE_S)  # turn 1's blocks went to D
        p0, s0 = counters(p_url), counters(survivor)
        expired0 = sample_sum(p_url, EXPIRED_LEASES)

        started = time.monotonic()
        second = chat.say(filler(200, seed=92))
        answered = time.monotonic() - started
        deadline = time.monotonic() + 4 * KV_LEASE_S
        while sample_sum(p_url, EXPIRED_LEASES) == expired0 and time.monotonic() < deadline:
            time.sleep(0.2)
        expired_at = time.monotonic() - started
        wait_for_kv_usage_zero(p_url, timeout_s=4 * KV_LEASE_S)
        dp, ds = delta(p0, counters(p_url)), delta(s0, counters(survivor))
        expired = sample_sum(p_url, EXPIRED_LEASES) - expired0

    print(f"\nturn 2 answered {answered:.1f} s after it was sent; P's lease for the dead D "
          f"expired (counted) {expired_at:.1f} s after it was sent (lease {KV_LEASE_S} s); "
          f"P's KV usage back to 0")
    assert (second.route, second.prefill, second.decode) == ("pd", p_url, survivor)
    # P prefilled twice: for the dead D (whose pull never came), then for the survivor.
    assert dp[REQUESTS] == 2 and dp[PROMPT_TOKENS] == 2 * second.prompt_tokens
    assert ds[REQUESTS] == 1 and ds[EXTERNAL_HITS] == second.prompt_tokens
    # P freed the dead D's blocks when their lease ran out, and holds no KV at all now: nothing
    # leaked. The survivor's pull normally frees its own blocks first; on a slow machine it can
    # come after its own 6 s lease too (seen once: turn 2 answered 13.7 s after it was sent),
    # so that lease may expire as well - never more than these two.
    assert 1 <= expired <= 2
