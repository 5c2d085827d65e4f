"""`Turn.view` in the proxy (`proxy.live.view.LiveView.cluster`): the usable nodes, the
proxy's in-flight and pick counts, the /metrics gauges while fresh, residency on D and R
nodes, and the session's home."""

from __future__ import annotations

from proxy.live.cluster_view import ClusterView, NodeView
from proxy.live.kv_events import BlockStored
from proxy.live.residency import Residency
from proxy.live.view import LiveView
from proxy.observability.node_gauges import NodeGauges, NodeMetrics
from proxy.sessions.session import Session
from proxy.shared.vocabulary import Role
from proxy.upstream.backends import BackendPool


def test_the_view_reads_the_pool_fresh_gauges_and_residency() -> None:
    now = [10.0]
    pool = BackendPool(clock=lambda: now[0])
    pool.add("http://p", Role.PREFILL)
    decode = pool.add("http://d", Role.DECODE)
    pool.add("http://down", Role.DECODE)
    pool.mark("http://down", healthy=False)
    decode.in_flight, decode.picks = 2, 5
    residency = Residency()
    residency.node("http://d").apply(BlockStored((1, 2), None, 64, 32, "s"))
    gauges = NodeGauges(clock=lambda: now[0])
    gauges.latest["http://d"] = NodeMetrics(running=40, waiting=2, kv_usage=0.75, at=9.0,
                                            kv_blocks=1000, kv_block_size=16)
    view = LiveView(pool, residency, gauges, max_age=3.0)
    session = Session("s", opening="o", hashed=False, decode="http://down", prefill="http://p")
    seen = view.cluster(session)
    assert seen == ClusterView((
        NodeView("http://p", Role.PREFILL),
        NodeView("http://d", Role.DECODE, 2, 5, 40, 2, 0.75, 1000, 16, 64)),
        home_prefill="http://p", home_decode="http://down")
    assert seen.node("http://down") is None and seen.usable(Role.DECODE)[0].kv_tokens == 16000
    now[0] = 20.0  # the reading is 11 s old: not trusted, the proxy's own count stands in
    stale = view.cluster(session).node("http://d")
    assert stale is not None and stale.running is None and stale.kv_usage is None
    assert (stale.busy, stale.held_tokens) == (2.0, 64)
