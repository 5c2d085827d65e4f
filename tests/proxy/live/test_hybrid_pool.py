"""A hybrid pool (R nodes beside P and D): what each policy does with it (plan_turn)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import proxy
from proxy import NodeSpec, ProxyConfig
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.live.predict import NodeState, StepCosts, TurnState, predict_placement
from proxy.live.residency import Residency
from proxy.live.scorer import LiveScorer
from proxy.live.view import LiveView
from proxy.observability.node_gauges import NodeGauges
from proxy.policies.routing import RoutingPolicy
from proxy.routing.turn_plan import Attempt, Pick, TurnPlan, plan_turn
from proxy.sessions.session import Lookup, Session
from proxy.shared.vocabulary import Decision, Reason, Role, RouteKind, Workload
from proxy.upstream.backends import BackendPool
from tests.fakes.mock_vllm import MockCluster
from tests.proxy.helpers import chat_body
from tests.proxy.router_harness import chat, router_over, text_of

COSTS = StepCosts(base_ms=6.0, per_prefill_token_ms=0.02, per_decode_seq_ms=0.01)
TURN1 = Workload(1, 500, 0, 100, 1.0)
TURN2 = Workload(2, 50, 600, 100, 1.0)


def hybrid_pool() -> BackendPool:
    pool = BackendPool(clock=lambda: 0.0)
    for url, role in (("http://p0", Role.PREFILL), ("http://d0", Role.DECODE),
                      ("http://r0", Role.REPLICA)):
        pool.add(url, role)
    return pool


def lookup(turn: int, decode: str | None = None, prefill: str | None = None) -> Lookup:
    return Lookup(Session("s", "opening", False, decode, prefill, turns=turn - 1), turn > 1)


def policy(config: PolicyConfig) -> RoutingPolicy:
    return RoutingPolicy(config, costs=COSTS)


@pytest.mark.parametrize("config", [PolicyConfig(kind=Policy.PD),
                                    PolicyConfig(kind=Policy.LOCAL),
                                    PolicyConfig(kind=Policy.FIXED, x=0.5),
                                    PolicyConfig(kind=Policy.THRESHOLD, non_cached_tokens=64)])
def test_disaggregated_policies_never_use_the_replicas(config: PolicyConfig) -> None:
    first = plan_turn(policy(config), hybrid_pool(), lookup(1), TURN1)
    assert (first.decision.kind, first.decision.reason) == (RouteKind.PD, Reason.TURN1)
    later = plan_turn(policy(config), hybrid_pool(), lookup(2, "http://d0", "http://p0"), TURN2)
    assert later.decision.kind in (RouteKind.PD, RouteKind.LOCAL)
    roles = {pick.role for attempt in (*first.attempts, *later.attempts) for pick in attempt.picks}
    assert Role.REPLICA not in roles


def test_policy_replica_sends_everything_to_the_replicas() -> None:
    for look, work in ((lookup(1), TURN1), (lookup(2, "http://r0"), TURN2)):
        plan = plan_turn(policy(PolicyConfig(kind=Policy.REPLICA)), hybrid_pool(), look, work)
        assert plan.decision.kind is RouteKind.REPLICA
        assert {p.role for a in plan.attempts for p in a.picks} == {Role.REPLICA}


IDLE = NodeState(0.0, 0.0, None, 16, 0.0)
# A replica decoding 64 requests with ~100 tokens to go each: a 500-token prefill in its batch
# delays them all.
BUSY = NodeState(64.0, 0.0, None, 16, 64 / 99)


def live_plan(pool: BackendPool, look: Lookup, work: Workload, replica: NodeState,
              seen: list[Session] | None = None, decode: NodeState = IDLE) -> TurnPlan:
    def observe(session: Session) -> TurnState:
        if seen is not None:
            seen.append(session)
        return TurnState(decode, IDLE, replica if pool.candidate(Role.REPLICA) else None)

    return plan_turn(policy(PolicyConfig(kind=Policy.LIVE)), pool, look, work, None, observe)


def test_live_places_turn_one_on_an_idle_replica_and_p_to_d_beside_a_busy_one() -> None:
    idle = live_plan(hybrid_pool(), lookup(1), TURN1, IDLE)
    assert idle.decision == Decision(RouteKind.REPLICA, Reason.REPLICA_LIVE)
    assert idle.attempts == (Attempt(RouteKind.REPLICA, (Pick(Role.REPLICA, None),)),)
    busy = live_plan(hybrid_pool(), lookup(1), TURN1, BUSY)
    assert busy.decision == Decision(RouteKind.PD, Reason.TURN1)


# A conversation with a short prompt and a long answer: its prefill delays a batch little, its
# decode lives in that batch for 1,000 steps.
LONG_ANSWER = Workload(1, 200, 0, 1000, 1.0)
# 300 requests decoding, of 2,000 output tokens each.
LARGE_BATCH = NodeState(300.0, 0.0, None, 16, 300 / 1999)


def score_without_membership(work: Workload, state: TurnState) -> float:
    """The placement's score as it was before each route was charged for the batch it joins."""
    scorer = LiveScorer(1.0, 1.0).counted(work)
    prediction = predict_placement(work, state, COSTS)
    return scorer.score(replace(prediction, joins_local=None, joins_pd=None), first_turn=True)


def test_live_places_a_conversation_beside_an_idle_d_rather_than_in_a_large_replica_batch(
        ) -> None:
    # The replica answers sooner (17.5 ms against P->D's 28 ms) and the 4 ms prefill costs
    # its long-output batch little, so the prefill's delay alone picks the replica...
    assert score_without_membership(LONG_ANSWER, TurnState(IDLE, IDLE, LARGE_BATCH)) > 0
    # ...but there the conversation would decode in a batch of 300 (step 9 ms) instead of
    # D's of none (6 ms), slowing 150 requests' worth of tokens beside it.
    plan = live_plan(hybrid_pool(), lookup(1), LONG_ANSWER, LARGE_BATCH)
    assert plan.decision == Decision(RouteKind.PD, Reason.TURN1)


def test_live_places_a_conversation_on_a_queued_replica_rather_than_in_a_large_d_batch(
        ) -> None:
    # The replica has 5 requests queued: its TTFT (43 ms) is worse than P->D's (37 ms)...
    queued = NodeState(2.0, 5.0, None, 16, 2 / 99)
    assert score_without_membership(LONG_ANSWER, TurnState(LARGE_BATCH, IDLE, queued)) < 0
    # ...but P->D has the conversation decode in D's batch of 300 for all its turns.
    plan = live_plan(hybrid_pool(), lookup(1), LONG_ANSWER, queued, decode=LARGE_BATCH)
    assert plan.decision == Decision(RouteKind.REPLICA, Reason.REPLICA_LIVE)


def test_a_replica_conversation_stays_on_its_replica_then_falls_back_to_p_to_d() -> None:
    seen: list[Session] = []
    plan = live_plan(hybrid_pool(), lookup(2, "http://r0"), TURN2, IDLE, seen)
    assert plan.decision == Decision(RouteKind.REPLICA, Reason.REPLICA_HOME)
    assert seen == []  # nothing to predict: the replica holds the history
    assert plan.attempts == (
        Attempt(RouteKind.REPLICA, (Pick(Role.REPLICA, "http://r0", only_preferred=True),)),
        Attempt(RouteKind.PD, (Pick(Role.DECODE, "http://r0"), Pick(Role.PREFILL, None))))


def test_a_replica_conversation_whose_replica_is_gone_is_placed_again() -> None:
    pool = hybrid_pool()
    pool.mark("http://r0", healthy=False)
    alone = live_plan(pool, lookup(2, "http://r0"), TURN2, IDLE)
    assert alone.decision == Decision(RouteKind.PD, Reason.NO_HOME)  # no replica left
    pool.add("http://r1", Role.REPLICA)
    other = live_plan(pool, lookup(2, "http://r0"), TURN2, IDLE)
    assert other.decision == Decision(RouteKind.REPLICA, Reason.REPLICA_LIVE)
    assert other.attempts == (Attempt(RouteKind.REPLICA, (Pick(Role.REPLICA, "http://r0"),)),)
    assert pool.pick(Role.REPLICA, "http://r0").url == "http://r1"  # type: ignore[union-attr]


def test_live_reads_the_cluster_for_turn_one_only_when_there_is_a_replica() -> None:
    seen: list[Session] = []
    pool = BackendPool(clock=lambda: 0.0)
    pool.add("http://p0", Role.PREFILL)
    pool.add("http://d0", Role.DECODE)
    plan = live_plan(pool, lookup(1), TURN1, IDLE, seen)
    assert plan.decision == Decision(RouteKind.PD, Reason.TURN1) and seen == []
    live_plan(hybrid_pool(), lookup(1), TURN1, IDLE, seen)
    assert len(seen) == 1


def test_a_d_conversation_stays_on_its_d_under_live() -> None:
    plan = live_plan(hybrid_pool(), lookup(2, "http://d0", "http://p0"), TURN2, IDLE)
    assert plan.decision.kind is RouteKind.LOCAL


def test_policies_other_than_live_send_a_replica_conversation_p_to_d() -> None:
    plan = plan_turn(policy(PolicyConfig(kind=Policy.LOCAL)), hybrid_pool(),
                     lookup(2, "http://r0"), TURN2)
    assert plan.decision == Decision(RouteKind.PD, Reason.NO_HOME)


async def test_the_router_keeps_a_replica_conversation_on_its_replica() -> None:
    async with router_over("p0", "d0", "r0") as h:
        h.router.policy = policy(PolicyConfig(kind=Policy.LIVE))
        h.router.view = LiveView(h.pool, Residency(), NodeGauges(h.clock), 3.0)
        # Every node idle: the replica answers turn 1 sooner and delays nobody.
        first, body = await h.ask(chat("Hello " * 50))
        second, body2 = await h.ask(chat("Hello " * 50, text_of(body), "And then?"))
        h.pool.mark(h.cluster["r0"].url, healthy=False)  # the replica is gone
        third, _ = await h.ask(chat("Hello " * 50, text_of(body), "And then?", text_of(body2),
                                    "More?"))
    routes = [(r.headers["x-ppd-route"], r.headers["x-ppd-decode"])
              for r in (first, second, third)]
    assert routes == [("replica", h.cluster["r0"].url), ("replica", h.cluster["r0"].url),
                      ("pd", h.cluster["d0"].url)]
    assert h.router.metrics.stats()["reasons"] == {"replica_live": 1, "replica_home": 1,
                                                   "no_home": 1}


@pytest.mark.parametrize("gone", ["http://p0", "http://d0"])
def test_live_counts_p_to_d_out_when_every_p_or_every_d_is_down(gone: str) -> None:
    pool = hybrid_pool()
    pool.mark(gone, healthy=False)
    # Beside a busy replica live would place turn 1 P->D (above); with no P->D, the replica.
    first = live_plan(pool, lookup(1), TURN1, BUSY)
    assert first == TurnPlan(Decision(RouteKind.REPLICA, Reason.REPLICA_LIVE),
                             (Attempt(RouteKind.REPLICA, (Pick(Role.REPLICA, None),)),))
    later = live_plan(pool, lookup(2, "http://d0", "http://p0"), TURN2, BUSY)
    if gone == "http://p0":  # its D still holds it: the turn stays there, whatever it costs
        assert later.decision == Decision(RouteKind.LOCAL, Reason.LIVE)
    else:  # its D is gone: placed again, on the replica
        assert later.decision == Decision(RouteKind.REPLICA, Reason.REPLICA_LIVE)


def test_live_without_p_to_d_keeps_a_session_on_its_d_even_without_replicas() -> None:
    pool = BackendPool(clock=lambda: 0.0)
    pool.add("http://p0", Role.PREFILL)
    pool.add("http://d0", Role.DECODE)
    pool.mark("http://p0", healthy=False)
    # A history D no longer holds would otherwise be worth moving P->D (reason evicted).
    evicted = NodeState(64.0, 0.0, 0, 16, 64 / 99)

    def observe(session: Session) -> TurnState:
        return TurnState(evicted, IDLE)

    plan = plan_turn(policy(PolicyConfig(kind=Policy.LIVE)), pool,
                     lookup(2, "http://d0", "http://p0"), TURN2, None, observe)
    assert plan.decision == Decision(RouteKind.LOCAL, Reason.LIVE)


@pytest.mark.parametrize(("kind", "down", "healthy"), [
    (Policy.LIVE, ("http://p0",), True),  # the replica serves
    (Policy.LIVE, ("http://d0",), True),
    (Policy.LIVE, ("http://r0",), True),  # P->D serves
    (Policy.LIVE, ("http://p0", "http://r0"), False),
    (Policy.PD, ("http://p0",), False),  # pd never uses the replica
    (Policy.REPLICA, ("http://p0", "http://d0"), True),
    (Policy.REPLICA, ("http://r0",), False),
])
def test_a_hybrid_pool_is_servable_by_its_replicas_under_live(
        kind: Policy, down: tuple[str, ...], healthy: bool) -> None:
    pool = hybrid_pool()
    for url in down:
        pool.mark(url, healthy=False)
    roles = policy(PolicyConfig(kind=kind)).serving_roles
    assert any(pool.can_serve(option) for option in roles) is healthy


async def test_live_health_and_service_with_every_p_down(tmp_path: Path) -> None:
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"base_ms": 6.0, "per_prefill_token_ms": 0.02,
                                 "per_decode_seq_ms": 0.01}))
    cluster = MockCluster("p1", "d1", "r1")
    roles = {"p": Role.PREFILL, "d": Role.DECODE, "r": Role.REPLICA}
    nodes = tuple(NodeSpec(n.url, roles[name[0]]) for name, n in cluster.nodes.items())
    config = ProxyConfig(nodes=nodes, policy=PolicyConfig(Policy.LIVE, live_costs=costs),
                         port=0, health_interval=600)
    app = proxy.create_app(config, transport=cluster.transport)
    async with app.test_app() as test_app:
        client = test_app.test_client()
        pool = app.extensions["ppd"].pool
        pool.mark(cluster["p1"].url, healthy=False)
        health = await client.get("/health")
        answered = await client.post("/v1/chat/completions", json=chat_body("hello " * 200))
        pool.mark(cluster["r1"].url, healthy=False)
        down = await client.get("/health")
    assert health.status_code == 200
    assert answered.status_code == 200
    assert (answered.headers["x-ppd-route"], answered.headers["x-ppd-decode"]) == \
        ("replica", cluster["r1"].url)
    assert down.status_code == 503
