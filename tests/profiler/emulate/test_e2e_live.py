"""`--policy live` on emulated nodes behind the real proxy: the emulated twin of
tests/e2e/test_eviction.py, in seconds and without vLLM.

`start_emulated_cluster` (what `ppd cluster up --emulate` runs) starts a 1P1D cluster timed by
the tiny model's vLLM-CPU preset (tables/tiny-cpu-1p1d.preset.json, the cluster the live cost
file was fitted to), each node with 48 KV blocks of 128 tokens (`--num-gpu-blocks-override`);
cluster.json names D's KV event endpoints and the real `ppd proxy --policy live` subscribes.
Six sessions of ~1,900 tokens go P->D in turn and push the first out of D's cache; the test's
own subscriber (the proxy's code, `KvWatcher`) records how many of the first session's tokens
D holds after each. With two long generations decoding on D, the evicted session's turn 2
goes P->D with reason `evicted` and the newest session's stays local with reason `live`;
the proxy's ppd_requests_total counts one of each. (The weights are w_tpot 6, as in the vLLM
test, which says why.)

Timing: nothing is compared with a clock. Every wait polls (events, /metrics) with a generous
deadline; the decisions depend on what D holds and on D's running count, not on how loaded
the machine is.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.cluster.emulated import start_emulated_cluster
from profiler.cluster.launcher import Cluster
from profiler.cluster.plan import ClusterConfig, parse_layout
from proxy.live.kv_sources import from_cluster_file
from proxy.live.kv_subscriber import (
    KvEventSource,
    KvEventSubscribers,
    NodeSubscriber,
    SubscriberStats,
)
from proxy.live.residency import NodeResidency
from proxy.shared.vocabulary import Role
from tests.e2e.support import (
    KV_READBACK_TTL_S,
    Conversation,
    Turn,
    evicted_moves_resident_stays,
    filler,
    free_base_port,
)

REPO = Path(__file__).resolve().parents[3]
PRESET = REPO / "tables" / "tiny-cpu-1p1d.preset.json"
LIVE_COSTS = REPO / "tables" / "tiny-cpu-1p1d.costs.json"
BLOCKS = 48  # each node's KV cache: 48 blocks of 128 tokens
BLOCK = 128
MAX_MODEL_LEN = 2048
SESSION_WORDS = 600  # about 1,900 tokens: 15 blocks a session
FLOOD = 5  # sessions after the first: ~90 blocks in all, more than D has
WAIT_S = 60.0


class KvWatcher:
    """The proxy's subscriber and residency index for one node, on a loop of its own thread.

    It expects batch 0 first: whatever was published before its SUB socket joined is a gap,
    which it fills from the node's replay socket - so no event is missed, however slow."""

    def __init__(self, source: KvEventSource) -> None:
        self.index = NodeResidency()
        subscriber = NodeSubscriber(source, self.index, SubscriberStats(last_seq=-1))
        self._subscribers = KvEventSubscribers([subscriber])
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def _call(self, fn, *args):  # type: ignore[no-untyped-def]
        async def run():  # type: ignore[no-untyped-def]
            return await fn(*args) if asyncio.iscoroutinefunction(fn) else fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(WAIT_S)

    def __enter__(self) -> KvWatcher:
        self._thread.start()
        self._call(self._subscribers.start)
        return self

    def __exit__(self, *exc: object) -> None:
        self._call(self._subscribers.stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def held(self, session: str) -> int | None:
        """Leading tokens of the session's history the node holds (None: unknown)."""
        return self._call(self.index.held_tokens, session)  # type: ignore[no-any-return]

    def settled(self, session: str, want: int) -> int | None:
        """held(session) once it equals want, or its last value after WAIT_S."""
        deadline = time.monotonic() + WAIT_S
        while (value := self.held(session)) != want and time.monotonic() < deadline:
            time.sleep(0.05)
        return value


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stored_tokens(turn: Turn) -> int:
    """D's cached tokens of a finished turn: prompt and reply but the last sampled token (never
    computed), in whole blocks."""
    return (turn.prompt_tokens + turn.completion_tokens - 1) // BLOCK * BLOCK


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # D keeps each finished turn's blocks for a readback as long as the real cluster's e2e
    # test has vLLM keep them (tests/e2e/test_eviction.py), pinned: the flood evicts only
    # once they are freed.
    config = ClusterConfig(model="tiny", layout=parse_layout("1P1D"),
                           base_port=free_base_port(2),
                           state_dir=tmp_path_factory.mktemp("emulated-live"),
                           kv_readback_ttl_s=KV_READBACK_TTL_S)
    with pytest.MonkeyPatch.context() as env:  # the tokenizer is built here, not in ~/.cache
        env.setenv("PPD_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        running = start_emulated_cluster(config, str(PRESET), max_model_len=MAX_MODEL_LEN,
                                         num_gpu_blocks=BLOCKS)
    with running:
        running.start_proxy("live", port=free_port(), extra_args=[
            "--live-costs", str(LIVE_COSTS), "--metrics-interval", "0.2", "--w-tpot", "6"])
        yield running


def test_the_cluster_file_names_d_events_and_not_p(cluster: Cluster) -> None:
    doc = json.loads(Path(cluster.cluster_file).read_text())
    nodes = {node["role"]: node for node in doc["nodes"]}
    assert "kv_events" not in nodes["prefill"]
    assert nodes["decode"]["kv_events"].startswith("tcp://127.0.0.1:")
    assert nodes["decode"]["kv_events_replay"].startswith("tcp://127.0.0.1:")


def test_an_evicted_session_goes_p_to_d_and_a_resident_one_stays_local(
        cluster: Cluster) -> None:
    proxy, d_url, model = cluster.proxy_url, cluster.url(Role.DECODE), cluster.model
    [source] = from_cluster_file(Path(cluster.cluster_file))
    with KvWatcher(source) as watcher:
        evicted = Conversation(proxy, model, "emu-evicted", max_tokens=8)
        first = evicted.say(filler(SESSION_WORDS, seed=100))
        assert (first.route, first.turn) == ("pd", 1)
        assert watcher.settled("emu-evicted", stored_tokens(first)) == stored_tokens(first)
        # Later sessions push the first one's blocks out of D's cache (LRU, tail first).
        later = [Conversation(proxy, model, f"emu-later-{i}", max_tokens=8)
                 for i in range(FLOOD)]
        first_held = []
        for i, conversation in enumerate(later):
            turn = conversation.say(filler(SESSION_WORDS, seed=200 + i))
            assert turn.route == "pd"
            assert watcher.settled(conversation.session, stored_tokens(turn)) \
                == stored_tokens(turn)  # the newest is whole, and every event before it in
            first_held.append(watcher.held("emu-evicted"))
        print(f"\nfirst session: {first.prompt_tokens} prompt tokens, "
              f"{stored_tokens(first)} held after its turn, then "
              f"{first_held} after each later session; newest: {stored_tokens(turn)}")
        assert first_held[-1] == 0
        assert first_held == sorted(first_held, reverse=True)  # only ever loses blocks
        assert watcher.index.num_blocks <= BLOCKS
        resident = later[-1]

    evicted_moves_resident_stays(proxy, d_url, model, resident, evicted)
