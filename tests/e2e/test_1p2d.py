"""Through the proxy on a real 1P2D vLLM cluster: concurrent conversations are spread over both
D nodes and each keeps its D for all of its turns (checked in headers and in vLLM's counters)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from profiler.cluster.launcher import Cluster
from proxy.vocabulary import Role
from tests.e2e.support import (
    PREFIX_HITS,
    REQUESTS,
    Conversation,
    Turn,
    counters,
    delta,
    filler,
    proxy_for,
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
