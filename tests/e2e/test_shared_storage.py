"""`--connector shared-storage` still works (real 1P1D vLLM cluster, ExampleConnector): turn 1
goes P->D with D reading P's KV from the shared directory; turn 2 under `local` is an
append-prefill on the same D that never touches P."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.cluster.launcher import Cluster
from profiler.cluster.plan import Connector
from proxy.shared.vocabulary import Role
from tests.e2e.support import (
    EXTERNAL_HITS,
    PREFIX_HITS,
    PROMPT_TOKENS,
    REQUESTS,
    Conversation,
    block_size,
    counters,
    delta,
    filler,
    proxy_for,
    start_e2e_cluster,
)


@pytest.fixture(scope="module")
def shared_storage_cluster(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
                           ) -> Iterator[Cluster]:
    with start_e2e_cluster("1P1D", tiny_model, tmp_path_factory,
                           Connector.SHARED_STORAGE) as cluster:
        yield cluster


def test_turn1_through_the_shared_directory_then_a_local_turn2(
    shared_storage_cluster: Cluster, tiny_model: Path
) -> None:
    p_url = shared_storage_cluster.url(Role.PREFILL)
    d_url = shared_storage_cluster.url(Role.DECODE)
    bs = block_size(d_url)
    with proxy_for(shared_storage_cluster, "local", tiny_model) as proxy:
        chat = Conversation(proxy, "tiny", "shared-storage")
        p0, d0 = counters(p_url), counters(d_url)
        first = chat.say(filler(500, seed=1))
        p1, d1 = counters(p_url), counters(d_url)
        second = chat.say(filler(40, seed=11))
        dp2, dd2 = delta(p1, counters(p_url)), delta(d1, counters(d_url))
    dp1, dd1 = delta(p0, p1), delta(d0, d1)

    assert (first.route, first.prefill, first.decode) == ("pd", p_url, d_url)
    assert dp1[REQUESTS] == 1 and dp1[PROMPT_TOKENS] == first.prompt_tokens
    # D read every full block of the prompt (but the last token) from P's files.
    assert dd1[EXTERNAL_HITS] + dd1[PREFIX_HITS] == (first.prompt_tokens - 1) // bs * bs
    assert dd1[EXTERNAL_HITS] > 0
    assert (second.route, second.decode) == ("local", d_url)
    assert dp2 == {REQUESTS: 0, PROMPT_TOKENS: 0, PREFIX_HITS: 0, EXTERNAL_HITS: 0}
    assert dd2[PREFIX_HITS] >= (first.prompt_tokens + first.completion_tokens) // bs * bs
    assert dd2[EXTERNAL_HITS] == 0
