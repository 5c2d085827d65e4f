"""`--policy live` on a real 1P1D vLLM-CPU cluster whose D has a small KV cache
(`--num-gpu-blocks-override`): D evicts an old session's blocks (LRU) and publishes it as KV
cache events; while D decodes a batch, that session's turn 2 goes P->D with reason `evicted`,
and a session D still holds stays local. The proxy's /metrics count both.

The weights are the paper's heaviest, w_tpot = 6: with the tiny model on this CPU a re-prefill
of the ~1,900-token history costs D ~13 ms (tables/tiny-cpu-1p1d.costs.json), less than
P->D's hand-off (~75 ms), so at w_tpot = 1 live rightly keeps even an evicted session local
(seen here: both turns local); only a user who weights TPOT sees the evicted one move."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.cluster.launcher import Cluster
from proxy.shared.vocabulary import Role
from tests.e2e.support import (
    Conversation,
    block_size,
    evicted_moves_resident_stays,
    filler,
    proxy_for,
    start_e2e_cluster,
)

REPO = Path(__file__).resolve().parents[2]
# The step costs of the tiny model on this machine's vLLM-CPU (fitted by `ppd sim calibrate`
# on NIXL runs, converted by `ppd sim live-costs`; tables/README.md says how).
LIVE_COSTS = REPO / "tables" / "tiny-cpu-1p1d.costs.json"
BLOCKS = 48  # D's whole KV cache: 48 blocks of 128 tokens (vLLM-CPU's block size)
MAX_MODEL_LEN = 2048
SESSION_WORDS = 600  # about 1,900 tokens: 15 blocks a session
FLOOD = 5  # sessions after the first: ~90 blocks in all, more than D has


@pytest.fixture(scope="module")
def small_cache_cluster(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
                        ) -> Iterator[Cluster]:
    with start_e2e_cluster("1P1D", tiny_model, tmp_path_factory, max_model_len=MAX_MODEL_LEN,
                           vllm_args=("--num-gpu-blocks-override", str(BLOCKS))) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def live_proxy(small_cache_cluster: Cluster, tiny_model: Path) -> Iterator[str]:
    with proxy_for(small_cache_cluster, "live", tiny_model, "--live-costs", str(LIVE_COSTS),
                   "--metrics-interval", "0.2", "--w-tpot", "6") as url:
        yield url


def test_an_evicted_session_goes_p_to_d_and_a_resident_one_stays_local(
        small_cache_cluster: Cluster, live_proxy: str) -> None:
    d_url = small_cache_cluster.url(Role.DECODE)
    model = small_cache_cluster.model
    evicted = Conversation(live_proxy, model, "e2e-evicted", max_tokens=8)
    first = evicted.say(filler(SESSION_WORDS, seed=100))
    assert (first.route, first.turn) == ("pd", 1)
    # Later sessions push the first one's blocks out of D's cache (vLLM evicts LRU blocks).
    later = [Conversation(live_proxy, model, f"e2e-later-{i}", max_tokens=8)
             for i in range(FLOOD)]
    turns = [conversation.say(filler(SESSION_WORDS, seed=200 + i))
             for i, conversation in enumerate(later)]
    assert {turn.route for turn in turns} == {"pd"}
    stored = first.prompt_tokens + sum(turn.prompt_tokens for turn in turns)
    assert stored > block_size(d_url) * BLOCKS  # more than D can hold: the oldest went
    resident = later[-1]

    evicted_moves_resident_stays(live_proxy, d_url, model, resident, evicted)
