"""One token definition: a synthetic turn 2 built for a cell is counted into that same cell by
the proxy's router (proxy.shared.tokens, "text-v1"), with the served model's tokenizer and chat
template present."""

from __future__ import annotations

from typing import Any

import pytest

from profiler.replay.request_bodies import Api, History
from profiler.traces import two_turn_conversations
from proxy.config.policy_config import Policy
from proxy.shared.discretize import TURN1_PROFILES, WORKLOAD_SHAPES, ContextClass, workload_shape
from proxy.shared.tokens import HFTokenCounter
from proxy.shared.vocabulary import Workload
from tests.bpe import train_bpe
from tests.proxy.router_harness import router_over, text_of


@pytest.fixture(scope="module")
def counter(tmp_path_factory: pytest.TempPathFactory) -> HFTokenCounter:
    # The template inserts a default system prompt: counting a turn's new messages through it
    # (what the proxy did before) adds ~20 tokens the profiler never put in, enough to move the
    # small shapes to another cell.
    return HFTokenCounter(train_bpe(tmp_path_factory.mktemp("bpe")))


@pytest.mark.parametrize("shape_name", list(WORKLOAD_SHAPES))
async def test_a_synthetic_turn_2_lands_in_its_own_cell_on_the_proxy_side(
        counter: HFTokenCounter, shape_name: str) -> None:
    turn1 = TURN1_PROFILES[ContextClass.SMALL]
    [conversation] = two_turn_conversations(turn1, shape_name, 1, seed=7, tokenizer=counter)
    seen: list[Workload] = []
    async with router_over("p1", "d1", policy=Policy.LOCAL) as h:
        h.router.counter = counter  # the proxy started with --tokenizer of the served model
        decide = h.router.policy.decide

        def spy(workload: Workload, *args: Any, **kwargs: Any) -> Any:
            seen.append(workload)
            return decide(workload, *args, **kwargs)

        h.router.policy.decide = spy  # type: ignore[method-assign]
        history = History(Api.CHAT, conversation.system)  # what the profiler's replay sends
        for turn in conversation.turns:
            history.add_user(turn.user)
            assert turn.n_out_tokens is not None
            _, content = await h.ask(history.body("fake-model", turn.n_out_tokens,
                                                  ignore_eos=True))
            history.add_reply(text_of(content))
    second = seen[1]
    assert second.turn == 2
    assert (second.n_in, second.n_out) == WORKLOAD_SHAPES[shape_name]
    assert workload_shape(second.n_in, second.n_out) == shape_name
