"""`Turn.view` in the simulator (`profiler.simulator.cluster_state.EngineView.cluster`): the
same fields the proxy fills, read off the engines - gauges vLLM would report, KV capacity,
the session's history cached on D (not on P), and the pool's own counts."""

from __future__ import annotations

from profiler.engine.config import EngineConfig
from profiler.engine.cost import LinearCost
from profiler.engine.engine import Engine
from profiler.engine.requests import Request
from profiler.simulator.cluster_state import EngineView
from proxy.sessions.session import Session
from proxy.shared.vocabulary import Role
from proxy.upstream.backends import BackendPool

HISTORY = list(range(100))


def test_the_view_reads_the_engines_as_the_proxy_reads_its_nodes(
        hand_cost: LinearCost) -> None:
    config = EngineConfig(num_kv_blocks=40, block_size=16)
    engines = {"http://p": Engine(config, hand_cost), "http://d": Engine(config, hand_cost)}
    pool = BackendPool(clock=lambda: 0.0)
    pool.add("http://p", Role.PREFILL)
    decode = pool.add("http://d", Role.DECODE)
    pool.add("http://down", Role.DECODE)
    pool.mark("http://down", healthy=False)
    decode.in_flight = 1
    for engine in engines.values():  # both have computed the history: only D's counts
        engine.submit(Request("r", max_tokens=2, prompt_token_ids=HISTORY), 0.0)
        engine.step(0.0)
    view = EngineView(engines, pool, lambda session_id: HISTORY).cluster(
        Session("s", "o", False, "http://d", "http://p"))
    assert [node.url for node in view.nodes] == ["http://p", "http://d"]
    assert (view.home_prefill, view.home_decode) == ("http://p", "http://d")
    prefill, decode_view = view.nodes
    assert prefill.held_tokens is None  # as in the proxy: P publishes no residency
    assert decode_view.held_tokens == 96  # the history's 6 full blocks of 16
    assert (decode_view.in_flight, decode_view.running, decode_view.waiting) == (1, 1.0, 0.0)
    assert decode_view.kv_tokens == 640 and 0 < (decode_view.kv_usage or 0) < 1
