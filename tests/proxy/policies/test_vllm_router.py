"""vllm-router's rule (`proxy.policies.vllm_router`): the session's D and P by consistent
hashing (160 points a node), P skipped at <= 256 uncached tokens (PR #130)."""

from __future__ import annotations

import pytest

from proxy.config.policy_config import PolicyConfig
from proxy.policies.base import Inputs
from proxy.policies.vllm_router import NAME, decide, ring_pick
from proxy.shared.vocabulary import Reason, RouteKind
from tests.proxy.policies.views import D0, D1, node, turn, view

INPUTS = Inputs(PolicyConfig(kind=NAME))


def test_a_session_keeps_its_nodes_turn_after_turn_and_sessions_spread() -> None:
    picks = {}
    for session in (f"s{i}" for i in range(200)):
        first = decide(turn(0, 100, number=1, session=session), INPUTS)
        later = decide(turn(500, 300, number=3, session=session), INPUTS)
        assert (later.decode, later.prefill) == (first.decode, first.prefill)
        picks[session] = first.decode
    share = sum(1 for d in picks.values() if d == D0) / len(picks)
    assert 0.3 < share < 0.7


def test_a_node_leaving_moves_only_its_own_sessions() -> None:
    nodes = tuple(node(f"http://d{i}") for i in range(4))
    before = {s: ring_pick(nodes, s) for s in (f"s{i}" for i in range(300))}
    after = {s: ring_pick(nodes[:3], s) for s in before}
    moved = [s for s in before if before[s] != after[s]]
    assert moved and all(before[s] == nodes[3] for s in moved)


@pytest.mark.parametrize(("n_in", "kind"), [(256, RouteKind.LOCAL), (257, RouteKind.PD)])
def test_p_is_skipped_at_256_uncached_tokens(n_in: int, kind: RouteKind) -> None:
    session = next(s for s in (f"s{i}" for i in range(50))
                   if ring_pick(view().usable(node(D0).role), s).url == D0)
    decision = decide(turn(1000, n_in, session=session), INPUTS)
    assert decision.kind is kind and decision.reason is Reason.THRESHOLD


def test_a_hashed_d_that_is_not_the_sessions_runs_p_to_d() -> None:
    session = next(s for s in (f"s{i}" for i in range(50))
                   if ring_pick(view().usable(node(D1).role), s).url == D1)
    decision = decide(turn(1000, 10, session=session), INPUTS)  # home D0, hashed D1
    assert decision.kind is RouteKind.PD and decision.decode == D1
