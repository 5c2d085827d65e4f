"""llm-d's sticky-until-saturated rule (`proxy.policies.llm_d_sticky`): warm pods (>= 80% of
the prompt cached) keep the request until their in-flight tokens exceed the coldest pod's by
more than 286,704 (18 s at 15,928 tokens/s); then the fewest tokens to process wins."""

from __future__ import annotations

import pytest

from proxy.config.policy_config import PolicyConfig
from proxy.policies.base import Inputs
from proxy.policies.llm_d_sticky import NAME, SATURATION_TOKENS, decide
from proxy.shared.vocabulary import Decision, Reason, RouteKind
from tests.proxy.policies.views import D0, D1, P0, node, turn, view

INPUTS = Inputs(PolicyConfig(kind=NAME))
BLOCKS = 100_000  # KV blocks of 16 tokens: 1.6M tokens per node


def _loaded(url: str, tokens: float, **fields: object):
    return node(url, kv_usage=tokens / (BLOCKS * 16), kv_blocks=BLOCKS, kv_block_size=16,
                **fields)


def test_the_gate_is_the_ttft_penalty_in_tokens() -> None:
    assert pytest.approx(286_704) == SATURATION_TOKENS


@pytest.mark.parametrize(("gap", "chosen"), [(286_704, D0), (286_720, D1)])
def test_a_warm_pod_keeps_the_request_until_it_is_saturated(gap: float, chosen: str) -> None:
    cluster = view(node(P0), _loaded(D0, 300_000, held_tokens=8000),
                   _loaded(D1, 300_000 - gap, held_tokens=0))
    assert decide(turn(8000, 2000, cluster), INPUTS).decode == chosen


@pytest.mark.parametrize(("held", "chosen"), [(7999, D1), (8000, D0)])
def test_warm_is_at_least_80_percent_of_the_prompt(held: int, chosen: str) -> None:
    # prompt 10,000: D0 caches `held`; D1 nothing but 10,000 fewer tokens in flight, so the
    # token load prefers D1 as soon as D0 is not warm (its uncached 2,001 + 20,000 in flight
    # against D1's 10,000 + 10,000 in flight)
    cluster = view(node(P0), _loaded(D0, 20_000, held_tokens=held),
                   _loaded(D1, 10_000, held_tokens=0))
    assert decide(turn(8000, 2000, cluster), INPUTS).decode == chosen


def test_p_is_skipped_below_16_uncached_tokens_as_in_llm_d() -> None:
    cluster = view(node(P0), _loaded(D0, 0, held_tokens=1000), _loaded(D1, 0))
    assert decide(turn(1000, 15, cluster), INPUTS) == Decision(
        RouteKind.LOCAL, Reason.THRESHOLD, decode=D0, prefill=P0)
    assert decide(turn(1000, 16, cluster), INPUTS).kind is RouteKind.PD


def test_no_warm_pod_leaves_the_choice_to_the_token_load() -> None:
    cluster = view(node(P0), _loaded(D0, 50_000, held_tokens=0),
                   _loaded(D1, 10_000, held_tokens=0), home_decode=None)
    assert decide(turn(0, 3000, cluster, number=1), INPUTS) == Decision(
        RouteKind.PD, Reason.TURN1, decode=D1, prefill=P0)
