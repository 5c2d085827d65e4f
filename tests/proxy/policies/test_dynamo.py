"""Dynamo's conditional disaggregation (`proxy.policies.dynamo`): isl_bounding on the KV
router's decode worker (eff_isl < 2048 and < 70% of the prompt), else P->D with the decode
leg on the least loaded D whatever it caches."""

from __future__ import annotations

import pytest

from proxy.config.policy_config import PolicyConfig
from proxy.policies.base import Inputs
from proxy.policies.dynamo import NAME, bypasses, decide, kv_cost
from proxy.shared.vocabulary import Decision, Reason, RouteKind
from tests.proxy.policies.views import D0, D1, P0, P1, node, turn, view

INPUTS = Inputs(PolicyConfig(kind=NAME))


@pytest.mark.parametrize(("prompt", "eff_isl", "bypass"), [
    (10_000, 2047, True), (10_000, 2048, False),  # the absolute bound, strict
    (1000, 699, True), (1000, 700, False),        # the ratio bound, strict
    (0, 0, True),                                 # an empty prompt does not divide by zero
])
def test_isl_bounding_at_its_boundaries(prompt: int, eff_isl: int, bypass: bool) -> None:
    assert bypasses(prompt, eff_isl) is bypass


def test_the_kv_cost_is_uncached_blocks_plus_used_blocks() -> None:
    cluster = view(node(D0, held_tokens=1600, kv_usage=0.5, kv_blocks=100, kv_block_size=16))
    # prompt 2000, cached 1600 -> 25 prefill blocks, + 50 used
    assert kv_cost(cluster.nodes[0], cluster, turn(1900, 100).workload) == 75.0
    assert kv_cost(cluster.nodes[0], cluster, turn(1900, 100).workload, 0.0) == 50.0


def test_a_mostly_cached_short_suffix_runs_on_the_sessions_d() -> None:
    cluster = view(node(P0), node(D0, held_tokens=8000), node(D1, held_tokens=0))
    assert decide(turn(8000, 2000, cluster), INPUTS) == Decision(
        RouteKind.LOCAL, Reason.THRESHOLD, decode=D0)


def test_a_disaggregated_turn_decodes_on_the_least_loaded_d_whatever_it_caches() -> None:
    cluster = view(node(P0, kv_usage=0.9, kv_blocks=100), node(P1, kv_usage=0.0, kv_blocks=100),
                   node(D0, held_tokens=8000, kv_usage=0.6, kv_blocks=1000),
                   node(D1, held_tokens=0, kv_usage=0.1, kv_blocks=1000))
    # 2,100 uncached of 10,100: over 2048, so P->D. P0 caches the history (the approximate
    # index): 131.25 uncached blocks + 90 used, against P1's 631.25 + 0
    decision = decide(turn(8000, 2100, cluster), INPUTS)
    assert decision == Decision(RouteKind.PD, Reason.THRESHOLD, decode=D1, prefill=P0)


def test_turn_one_is_disaggregated() -> None:
    decision = decide(turn(0, 100, number=1), INPUTS)
    assert decision.kind is RouteKind.PD and decision.reason is Reason.TURN1
