"""SimProxy: the proxy's ledger, policy and pool on a virtual clock."""

from __future__ import annotations

from profiler.simulator.sim_proxy import SimProxy, hashed_placement
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.policies.routing import RoutingPolicy
from proxy.shared.vocabulary import Node, Reason, Role, RouteKind

NODES = [Node("http://p0", Role.PREFILL), Node("http://d0", Role.DECODE),
         Node("http://d1", Role.DECODE)]


def _proxy(kind: Policy, **kwargs: object) -> tuple[SimProxy, list[float]]:
    now = [0.0]
    proxy = SimProxy(NODES, RoutingPolicy(PolicyConfig(kind=kind, **kwargs)),  # type: ignore[arg-type]
                     lambda: now[0])
    return proxy, now


def test_turn_one_goes_p_to_d_and_turn_two_stays_on_its_d() -> None:
    proxy, _ = _proxy(Policy.LOCAL)
    first = proxy.begin("c1", 1, 100, 10)
    assert first.route is RouteKind.PD and first.prefill is not None
    assert first.decision.reason is Reason.TURN1
    proxy.prefilled(first)
    proxy.end(first, True, 100, 10)
    second = proxy.begin("c1", 2, 20, 10)
    assert second.route is RouteKind.LOCAL and second.decode.url == first.decode.url
    assert second.workload.n_ctx == 110 and second.workload.n_in == 20
    assert second.lookup.turn == 2


def test_a_failed_turn_is_not_held_so_the_next_is_a_new_branch() -> None:
    proxy, _ = _proxy(Policy.LOCAL)
    first = proxy.begin("c1", 1, 100, 10)
    proxy.end(first, False, 0, 0)
    again = proxy.begin("c1", 2, 20, 10)
    assert again.lookup.turn == 1 and again.route is RouteKind.PD


def test_new_sessions_spread_over_the_least_loaded_decode_nodes() -> None:
    proxy, _ = _proxy(Policy.PD)
    a = proxy.begin("a", 1, 10, 10)
    b = proxy.begin("b", 1, 10, 10)
    assert {a.decode.url, b.decode.url} == {"http://d0", "http://d1"}
    assert sum(node.in_flight for node in proxy.pool.nodes(Role.DECODE)) == 2
    proxy.end(a, True, 10, 10)
    proxy.end(b, True, 10, 10)
    assert all(node.in_flight == 0 for node in proxy.pool.nodes())


def test_the_papers_placement_ignores_load_and_keeps_each_conversation_on_its_node() -> None:
    """The paper's proxy (`--client paper`): a new conversation goes to its hashed D even
    while that D is the busier one, and later turns stay there."""
    decodes = ["http://d0", "http://d1"]
    proxy = SimProxy(NODES, RoutingPolicy(PolicyConfig(kind=Policy.LOCAL)), lambda: 0.0,
                     placement_seed=7)
    ids = [f"c{i}" for i in range(40)]
    plans = [proxy.begin(cid, 1, 10, 10) for cid in ids]  # none ends: load piles up
    placed = [plan.decode.url for plan in plans]
    assert placed == [hashed_placement(decodes, cid, 7) for cid in ids]
    counts = [placed.count(url) for url in decodes]
    assert min(counts) >= 10 and counts[0] != counts[1]  # random, not alternating by load
    for cid, plan in zip(ids, plans, strict=True):
        proxy.end(plan, True, 10, 10)
        later = proxy.begin(cid, 2, 5, 10)
        assert later.route is RouteKind.LOCAL and later.decode.url == plan.decode.url
        proxy.end(later, True, 5, 10)


def test_the_papers_placement_is_a_fixed_draw_per_seed() -> None:
    urls = ["http://d0", "http://d1", "http://d2"]
    draw = [hashed_placement(urls, f"c{i}", 1) for i in range(300)]
    assert draw == [hashed_placement(urls, f"c{i}", 1) for i in range(300)]
    assert draw != [hashed_placement(urls, f"c{i}", 2) for i in range(300)]
    assert all(70 <= draw.count(url) <= 130 for url in urls)
    assert hashed_placement([], "c0", 1) is None


def test_the_load_meter_runs_on_the_virtual_clock() -> None:
    proxy, now = _proxy(Policy.PD, )
    for i in range(6):
        now[0] = float(i)
        plan = proxy.begin(f"c{i}", 1, 10, 10)
    assert plan.workload.qps == 6 / 30.0  # six turns in the proxy's 30 s window


def test_forced_routes_follow_the_routers_rule() -> None:
    now = [0.0]
    proxy = SimProxy(NODES, RoutingPolicy(PolicyConfig(kind=Policy.PD)), lambda: now[0],
                     forced=lambda turn: RouteKind.LOCAL)
    first = proxy.begin("c", 1, 10, 10)
    assert first.route is RouteKind.PD and first.decision.reason is Reason.NO_HOME
    proxy.end(first, True, 10, 10)
    second = proxy.begin("c", 2, 10, 10)
    assert second.route is RouteKind.LOCAL and second.decision.reason is Reason.FORCED
