"""The readback route through the Router's seams: mock Ds that keep a turn's blocks as vLLM's
bidirectional NIXL does, mock Ps that tokenize (tests/fakes/mock_vllm.py), a fake clock.

What P is told to read (D's own params, never a client's; only the tokens of the new prompt
that D's blocks hold), once; the fallbacks to P->D with their reasons; what the client sees.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from proxy.config.policy_config import Policy
from proxy.readback.protocol import EXPIRY_MARGIN_S, MIN_READBACK_TOKENS
from proxy.sessions.readback_book import ReadbackBook
from proxy.sessions.readbacks import MemoryReadbacks
from proxy.shared.vocabulary import RouteKind
from proxy.upstream.pd_protocol import P_KV_TRANSFER_PARAMS
from tests.fakes.mock_vllm import fake_chat_ids, fake_ids
from tests.proxy.router_harness import Harness, chat, router_over, text_of

TTL_S = 60.0
LONG = " ".join(f"word{i}" for i in range(MIN_READBACK_TOKENS + 10))  # enough to read back


@asynccontextmanager
async def readback_router(*names: str, policy: Policy = Policy.READBACK) -> AsyncIterator[Harness]:
    """A router whose nodes offer the readback (their Ds keep a turn's blocks for TTL_S),
    under a policy that reads back (by default: D keeps blocks for no other)."""
    async with router_over(*names, policy=policy) as h:
        h.router.readback = MemoryReadbacks(ReadbackBook(1000, h.clock))
        h.router.readback_ttl = TTL_S
        for name in names:
            h.cluster[name].keeps_readback = name.startswith("d")
        yield h


async def two_turns(h: Harness, first: str = LONG, **second: Any) -> tuple[Any, dict[str, Any]]:
    """Turn 1 P->D (whole answer), then turn 2 forced to readback; turn 2's reply and body."""
    _, content = await h.ask(chat(first))
    body = chat(first, text_of(content), "And then?")
    reply, answer = await h.ask(body, forced=RouteKind.READBACK, **second)
    return reply, {"body": body, "answer": json.loads(answer)}


def reasons(h: Harness) -> dict[str, int]:
    return h.router.metrics.stats()["reasons"]


async def test_turn2_reads_back_ds_blocks_then_hands_its_own_to_d() -> None:
    async with readback_router("p1", "d1") as h:
        reply, turn2 = await two_turns(h)
        p_legs = [r for r in h.cluster["p1"].received if r.path != "/tokenize"]
        tokenized = [r for r in h.cluster["p1"].received if r.path == "/tokenize"]
        d1 = h.cluster["d1"].received
    d_params = json.loads(json.dumps(d1[0].body))  # turn 1's D leg
    assert d_params["return_token_ids"] is True
    held_tokens = len(fake_chat_ids(chat(LONG)["messages"])) + len(
        fake_ids("Hello from d1, a fake node.")) - 1
    assert reply.status == 200 and reply.headers["x-ppd-route"] == "readback"
    # P's leg carries D's own params, reading exactly the tokens D's blocks hold.
    p_params = p_legs[1].body["kv_transfer_params"]
    assert p_params["remote_engine_id"] == "engine-d1"
    assert p_params["remote_request_id"] == d1[0].headers["x-request-id"]
    assert p_params["do_remote_decode"] is True and p_params["remote_num_tokens"] == held_tokens
    assert tokenized[0].body["messages"] == turn2["body"]["messages"]
    # D gets P's params, as on any P->D turn.
    assert d1[1].body["kv_transfer_params"]["remote_engine_id"] == "engine-p1"
    stats = h.router.metrics.stats()
    assert stats["routes"] == {"pd": 1, "readback": 1}
    assert stats["readback"] == {"served": 1, "tokens": held_tokens, "fallbacks": {}}
    exposition = h.router.metrics.exposition().decode()
    assert f"ppd_readback_tokens_total {float(held_tokens)}" in exposition
    assert re.search(r'ppd_requests_total\{[^}]*reason="forced",route="readback"[^}]*\} 1\.0',
                     exposition)


async def test_the_client_never_sees_the_ids_and_blocks_the_proxy_asked_for() -> None:
    async with readback_router("p1", "d1") as h:
        _, turn2 = await two_turns(h)
    answer = turn2["answer"]
    assert "kv_transfer_params" not in answer and "prompt_token_ids" not in answer
    assert "token_ids" not in answer["choices"][0]
    assert answer["choices"][0]["message"]["content"] == "Hello from d1, a fake node."


async def test_a_client_that_asks_for_token_ids_keeps_them_and_gets_no_readback() -> None:
    async with readback_router("p1", "d1") as h:
        _, content = await h.ask(chat(LONG, return_token_ids=True))
        assert "prompt_token_ids" in json.loads(content)
        reply, _ = await h.ask(chat(LONG, text_of(content), "And?"), forced=RouteKind.READBACK)
    assert reply.headers["x-ppd-route"] == "pd"
    assert reasons(h)["readback_missing"] == 1


async def test_only_the_tokens_that_match_are_read_back() -> None:
    # D's reply ids differ from the ids the reply text re-tokenizes into from the 3rd on:
    # P reads the prompt and the first two reply tokens, and computes the rest.
    async with readback_router("p1", "d1") as h:
        reply_ids = fake_ids("Hello from d1, a fake node.")
        h.cluster["d1"].reply_ids = [*reply_ids[:2], 3, *reply_ids[3:]]
        reply, _ = await two_turns(h)
        p_leg = [r for r in h.cluster["p1"].received if r.path != "/tokenize"][1]
    assert reply.headers["x-ppd-route"] == "readback"
    prompt = len(fake_chat_ids(chat(LONG)["messages"]))
    assert p_leg.body["kv_transfer_params"]["remote_num_tokens"] == prompt + 2


async def test_too_few_matching_tokens_go_pd_with_reason_mismatch() -> None:
    async with readback_router("p1", "d1") as h:
        h.cluster["d1"].reply_ids = [3] * 6
        reply, turn2 = await two_turns(h, first="short")
        p_leg = [r for r in h.cluster["p1"].received if r.path != "/tokenize"][1]
    assert reply.status == 200 and reply.headers["x-ppd-route"] == "pd"
    assert p_leg.body["kv_transfer_params"] == P_KV_TRANSFER_PARAMS
    assert reasons(h)["readback_mismatch"] == 1
    assert turn2["answer"]["choices"][0]["message"]["content"] == "Hello from d1, a fake node."


async def test_expired_blocks_go_pd_with_reason_expired_and_no_tokenize() -> None:
    async with readback_router("p1", "d1") as h:
        _, content = await h.ask(chat(LONG))
        h.clock.now += TTL_S - EXPIRY_MARGIN_S
        reply, _ = await h.ask(chat(LONG, text_of(content), "Later"), forced=RouteKind.READBACK)
        paths = [r.path for r in h.cluster["p1"].received]
    assert reply.status == 200 and reply.headers["x-ppd-route"] == "pd"
    assert "/tokenize" not in paths
    assert reasons(h)["readback_expired"] == 1
    assert h.router.metrics.stats()["readback"]["fallbacks"] == {"readback_expired": 1}


async def test_blocks_are_read_once_a_second_turn_on_the_same_history_goes_pd() -> None:
    async with readback_router("p1", "d1") as h:
        _, content = await h.ask(chat(LONG))
        body = chat(LONG, text_of(content), "And then?")
        first, _ = await h.ask(body, forced=RouteKind.READBACK)
        again, _ = await h.ask(body, forced=RouteKind.READBACK)  # a retry: a fork of turn 1
    assert first.headers["x-ppd-route"] == "readback"
    assert again.headers["x-ppd-route"] == "pd"
    assert reasons(h)["readback_missing"] == 1


async def test_a_streamed_turn_leaves_nothing_to_read_back() -> None:
    # vLLM names D's blocks in a whole answer only: after a streamed turn there is nothing.
    async with readback_router("p1", "d1") as h:
        _, content = await h.ask(chat(LONG, stream=True))
        assert "return_token_ids" not in h.cluster["d1"].received[0].body
        reply, _ = await h.ask(chat(LONG, text_of(content), "And?"), forced=RouteKind.READBACK)
    assert reply.headers["x-ppd-route"] == "pd"
    assert reasons(h)["readback_missing"] == 1


async def test_a_readback_turn_keeps_the_chain_going() -> None:
    async with readback_router("p1", "d1") as h:
        _, content = await h.ask(chat(LONG))
        history = [LONG, text_of(content), "Two"]
        _, content = await h.ask(chat(*history), forced=RouteKind.READBACK)
        third, _ = await h.ask(chat(*history, text_of(content), "Three"),
                               forced=RouteKind.READBACK)
    assert third.headers["x-ppd-route"] == "readback"
    assert h.router.metrics.stats()["routes"] == {"pd": 1, "readback": 2}


async def test_without_readback_nodes_a_forced_readback_goes_pd() -> None:
    async with router_over("p1", "d1") as h:
        _, content = await h.ask(chat(LONG))
        reply, _ = await h.ask(chat(LONG, text_of(content), "And?"), forced=RouteKind.READBACK)
        d_leg = h.cluster["d1"].received[0].body
    assert reply.headers["x-ppd-route"] == "pd"
    assert "return_token_ids" not in d_leg
    assert reasons(h)["readback_missing"] == 1


async def test_a_policy_that_never_reads_back_asks_d_to_keep_nothing() -> None:
    # The nodes offer readback, but pd never reads it: D's legs ask for no ids and no kept
    # blocks (D would pin them for the TTL for nothing), and a turn forced to readback finds
    # nothing kept and runs P->D (readback_missing).
    async with readback_router("p1", "d1", policy=Policy.PD) as h:
        _, content = await h.ask(chat(LONG))
        history = [LONG, text_of(content), "Two"]
        second, content = await h.ask(chat(*history), forced=RouteKind.LOCAL)
        third, _ = await h.ask(chat(*history, text_of(content), "Three"),
                               forced=RouteKind.READBACK)
        d_legs = [r.body for r in h.cluster["d1"].received]
        p_paths = [r.path for r in h.cluster["p1"].received]
    assert second.headers["x-ppd-route"] == "local"
    assert len(d_legs) == 3
    assert all("return_token_ids" not in leg for leg in d_legs)
    assert "kv_transfer_params" not in d_legs[1]  # the local leg: no KEEP_BLOCKS
    assert third.status == 200 and third.headers["x-ppd-route"] == "pd"
    assert "/tokenize" not in p_paths
    assert reasons(h)["readback_missing"] == 1
    assert h.router.metrics.stats()["readback"]["served"] == 0


async def test_a_client_kv_transfer_params_never_reach_p_on_a_readback() -> None:
    async with readback_router("p1", "d1") as h:
        forged = {"do_remote_decode": True, "remote_engine_id": "evil", "remote_host": "6.6.6.6",
                  "remote_block_ids": [1], "remote_request_id": "x", "remote_port": 1,
                  "remote_num_tokens": 10**6}
        _, content = await h.ask(chat(LONG, kv_transfer_params=forged))
        await h.ask(chat(LONG, text_of(content), "And?", kv_transfer_params=forged),
                    forced=RouteKind.READBACK)
        p_legs = [r for r in h.cluster["p1"].received if r.path != "/tokenize"]
    assert p_legs[0].body["kv_transfer_params"] == P_KV_TRANSFER_PARAMS
    assert p_legs[1].body["kv_transfer_params"]["remote_engine_id"] == "engine-d1"


async def test_turn1_forced_to_readback_goes_pd_no_home() -> None:
    async with readback_router("p1", "d1") as h:
        reply, _ = await h.ask(chat(LONG), forced=RouteKind.READBACK)
    assert reply.headers["x-ppd-route"] == "pd"
    assert reasons(h)["no_home"] == 1


async def test_a_whole_local_turn_asks_d_to_keep_its_blocks_for_the_next_readback() -> None:
    async with readback_router("p1", "d1") as h:
        _, content = await h.ask(chat(LONG))
        history = [LONG, text_of(content), "Two"]
        second, content = await h.ask(chat(*history), forced=RouteKind.LOCAL)
        local_leg = h.cluster["d1"].received[-1].body
        third, _ = await h.ask(chat(*history, text_of(content), "Three"),
                               forced=RouteKind.READBACK)
        p_leg = [r for r in h.cluster["p1"].received if r.path != "/tokenize"][-1]
    assert second.headers["x-ppd-route"] == "local"
    assert local_leg["kv_transfer_params"] == {"do_remote_prefill": False,
                                               "do_remote_decode": False}
    assert local_leg["return_token_ids"] is True
    assert third.headers["x-ppd-route"] == "readback"
    # P reads the blocks D kept for the local turn: the history P never saw.
    local_prompt = len(fake_chat_ids(chat(*history)["messages"]))
    assert p_leg.body["kv_transfer_params"]["remote_num_tokens"] == local_prompt + 5


async def test_several_choices_leave_nothing_to_read_back() -> None:
    async with readback_router("p1", "d1") as h:
        await h.ask(chat(LONG, n=2))
        d_leg = h.cluster["d1"].received[0].body
    assert "return_token_ids" not in d_leg


async def test_a_streamed_local_turn_is_left_alone() -> None:
    async with readback_router("p1", "d1") as h:
        _, content = await h.ask(chat(LONG))
        await h.ask(chat(LONG, text_of(content), "Two", stream=True), forced=RouteKind.LOCAL)
        local_leg = h.cluster["d1"].received[-1].body
    assert "kv_transfer_params" not in local_leg and "return_token_ids" not in local_leg


class CountingReadbacks(MemoryReadbacks):
    """The memory book, counting how often the router asks whether a readback is possible."""

    def __init__(self, book: ReadbackBook) -> None:
        super().__init__(book)
        self.asked = 0

    async def status(self, lookup: Any) -> Any:
        self.asked += 1
        return await super().status(lookup)


async def test_the_book_is_asked_only_when_a_readback_can_follow() -> None:
    """A shared book costs a round trip per turn: a policy that never reads back (pd here)
    does not ask it, a turn forced to readback does, and so does a policy that reads back."""
    async with readback_router("p1", "d1", policy=Policy.PD) as h:
        book = CountingReadbacks(ReadbackBook(1000, h.clock))
        h.router.readback = book
        _, content = await h.ask(chat(LONG))
        body = chat(LONG, text_of(content), "And then?")
        reply, _ = await h.ask(body)
        assert reply.headers["x-ppd-route"] == "pd" and book.asked == 0
        reply, _ = await h.ask(chat(LONG, text_of(content), "Or else?"),
                               forced=RouteKind.READBACK)
        assert book.asked == 1
    async with router_over("p1", "d1", policy=Policy.READBACK) as h:
        book = CountingReadbacks(ReadbackBook(1000, h.clock))
        h.router.readback, h.router.readback_ttl = book, TTL_S
        h.cluster["d1"].keeps_readback = True
        _, content = await h.ask(chat(LONG))
        reply, _ = await h.ask(chat(LONG, text_of(content), "And then?"))
        # both turns ask (turn 1 continues nothing: a shared book answers that without Redis)
        assert book.asked == 2 and reply.headers["x-ppd-route"] == "readback"


async def test_a_readback_p_declines_is_retried_on_that_p_as_plain_pd() -> None:
    """Issue #45, failure 13: on a one-P cluster a declined readback was a 502."""
    from tests.fakes.mock_vllm import Fault

    for fault in (Fault.status(500), Fault.status(400), Fault.garbage()):
        async with readback_router("p1", "d1") as h:
            _, content = await h.ask(chat(LONG))
            h.cluster["p1"].script(Fault(), fault)  # /tokenize answers, the read fails
            reply, _ = await h.ask(chat(LONG, text_of(content), "And then?"),
                                   forced=RouteKind.READBACK)
            p_legs = [r for r in h.cluster["p1"].received if r.path != "/tokenize"]
        assert reply.status == 200 and reply.headers["x-ppd-route"] == "pd", fault
        assert "remote_num_tokens" in p_legs[1].body["kv_transfer_params"]  # the read
        assert p_legs[2].body["kv_transfer_params"] == P_KV_TRANSFER_PARAMS  # then plain
        assert p_legs[1].headers["x-request-id"] != p_legs[2].headers["x-request-id"]
        assert reasons(h)["readback_declined"] == 1
        assert h.router.metrics.stats()["readback"]["fallbacks"] == {"readback_declined": 1}
