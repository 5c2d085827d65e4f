"""The Router through its seams: mock nodes behind an httpx.MockTransport and a fake clock.

Legs and headers, the lease (admission + node slots, released once on every path), 4xx
pass-through, the x-ppd-* headers of errors, and kv_transfer_params only ever set by the proxy.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from proxy.config.policy_config import Policy
from proxy.shared.errors import NoBackend, Overloaded, UpstreamError
from proxy.shared.validate import Endpoint
from proxy.shared.vocabulary import RouteKind
from proxy.upstream.pd_protocol import P_KV_TRANSFER_PARAMS
from proxy.upstream.relay import Relay
from tests.fakes.mock_vllm import Fault
from tests.proxy.router_harness import chat, read, router_over, text_of


async def test_turn1_runs_p_then_d_with_ps_kv_params_and_one_request_id() -> None:
    async with router_over("p1", "d1") as h:
        body = chat("Hi there", stream=True, stream_options={"include_usage": True})
        reply, content = await h.ask(body)
        [p_req], [d_req] = h.cluster["p1"].received, h.cluster["d1"].received
        kv_params = h.cluster["p1"].kv_params or {}
    assert reply.status == 200
    assert reply.headers == {"x-ppd-session": reply.headers["x-ppd-session"],
                             "x-ppd-turn": "1", "x-ppd-route": "pd", "x-ppd-reason": "turn1",
                             "x-ppd-decode": "http://d1", "x-ppd-prefill": "http://p1",
                             "cache-control": "no-cache"}
    assert p_req.body["kv_transfer_params"] == P_KV_TRANSFER_PARAMS
    assert p_req.body["max_tokens"] == 1 and p_req.body["stream"] is False
    assert d_req.body == {**body, "kv_transfer_params": {
        **kv_params, "remote_request_id": p_req.headers["x-request-id"]}}
    assert p_req.headers["x-request-id"] == d_req.headers["x-request-id"]
    assert text_of(content) == "Hello from d1, a fake node."
    assert content.endswith(b"data: [DONE]\n\n")


async def test_local_turn2_goes_to_the_sessions_d_alone() -> None:
    async with router_over("p1", "d1", "d2", policy=Policy.LOCAL) as h:
        first, content = await h.ask(chat("Hello"))
        second, _ = await h.ask(chat("Hello", text_of(content), "And then?"))
        home = h.cluster[first.headers["x-ppd-decode"][7:]]
    assert (second.headers["x-ppd-route"], second.headers["x-ppd-turn"]) == ("local", "2")
    assert second.headers["x-ppd-decode"] == first.headers["x-ppd-decode"]
    assert "x-ppd-prefill" not in second.headers
    assert len(h.cluster["p1"].received) == 1
    assert "kv_transfer_params" not in home.received[-1].body


async def test_a_streamed_reply_holds_its_lease_until_the_relay_ends() -> None:
    async with router_over("p1", "d1") as h:
        reply = await h.send(chat("Hi", stream=True))
        assert isinstance(reply.body, Relay)
        # P's slot ended with the P leg; D's and the admission slot last as long as the body.
        assert h.in_flight() == {"http://p1": 0, "http://d1": 1, "admitted": 1}
        await read(reply)
        assert h.in_flight() == {"http://p1": 0, "http://d1": 0, "admitted": 0}
        await reply.body.aclose()  # a second close releases nothing twice
        assert h.in_flight() == {"http://p1": 0, "http://d1": 0, "admitted": 0}


async def test_closing_the_relay_early_closes_upstream_and_releases_everything() -> None:
    async with router_over("p1", "d1") as h:
        reply = await h.send(chat("Hi", stream=True))
        assert isinstance(reply.body, Relay)
        await anext(reply.body)
        await reply.body.aclose()
        assert h.in_flight() == {"http://p1": 0, "http://d1": 0, "admitted": 0}
        assert h.cluster["d1"].cancelled == 1
        # The client left: D's circuit learned nothing, and the turn was not recorded.
        assert h.pool.get("http://d1").circuit.failures == 0  # type: ignore[union-attr]
        assert await h.router.sessions.snapshot() == []


async def test_admission_answers_overloaded_until_a_slot_is_free() -> None:
    async with router_over("p1", "d1", max_in_flight=1) as h:
        open_reply = await h.send(chat("first", stream=True))
        with pytest.raises(Overloaded, match="limit of 1 open requests"):
            await h.send(chat("second"))
        await read(open_reply)
        third, _ = await h.ask(chat("third"))
    assert third.status == 200
    assert h.router.metrics.stats()["responses"] == {"200": 2, "429": 1}


async def test_a_request_that_fails_everywhere_releases_every_slot() -> None:
    async with router_over("p1", "p2", "d1", "d2") as h:
        for name in ("d1", "d2"):
            h.cluster[name].script(Fault.status(500))
        with pytest.raises(UpstreamError):
            await h.send(chat("x"))
        assert h.in_flight() == {"http://p1": 0, "http://p2": 0, "http://d1": 0, "http://d2": 0,
                                 "admitted": 0}


async def test_a_cancelled_request_releases_its_lease_and_its_legs() -> None:
    async with router_over("p1", "d1") as h:
        h.cluster["p1"].script(Fault.hang())
        task = asyncio.create_task(h.send(chat("x")))
        while not h.cluster["p1"].open:
            await asyncio.sleep(0)
        # D is counted busy from its pick: concurrent new turns spread over the other Ds.
        assert h.in_flight() == {"http://p1": 1, "http://d1": 1, "admitted": 1}
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert h.in_flight() == {"http://p1": 0, "http://d1": 0, "admitted": 0}
        assert h.cluster["p1"].cancelled == 1
        # Neither success nor failure: the P's circuit is untouched.
        assert h.circuit("p1") == "closed"


@pytest.mark.parametrize("failing", ["p1", "d1"])
async def test_an_upstream_4xx_goes_back_as_is_without_failover(failing: str) -> None:
    async with router_over("p1", "p2", "d1", "d2") as h:
        h.cluster[failing].script(Fault.status(400))
        reply, content = await h.ask(chat("x"))
        touched = {name for name, node in h.cluster.nodes.items() if node.received}
    assert reply.status == 400
    assert content == b'{"error": {"message": "' + failing.encode() + \
        b' fails on cue", "type": "fake", "code": 400}}'
    assert reply.headers["x-ppd-route"] == "pd" and reply.headers["x-ppd-turn"] == "1"
    # P's refusal never reaches a D; D's refusal is not retried on another D or P.
    assert touched == ({"p1"} if failing == "p1" else {"p1", "d1"})
    assert h.router.metrics.stats()["failovers"] == 0
    assert all(n.circuit.failures == 0 for n in h.pool.nodes())
    assert h.in_flight()["admitted"] == 0


async def test_errors_carry_the_headers_known_when_they_happen() -> None:
    async with router_over("p1", "d1", policy=Policy.LOCAL) as h:
        first, content = await h.ask(chat("Hello"))
        h.cluster["d1"].script(Fault.status(503))
        with pytest.raises(UpstreamError) as raised:
            await h.send(chat("Hello", text_of(content), "more"))
    # The local try failed, P->D found no other D: the route tried last was pd.
    assert raised.value.headers == {"x-ppd-session": first.headers["x-ppd-session"],
                                    "x-ppd-turn": "2", "x-ppd-route": "pd",
                                    "x-ppd-reason": "policy"}


async def test_no_usable_node_is_a_503_that_says_why() -> None:
    async with router_over("p1", "d1", "d2") as h:
        h.pool.mark("http://d1", healthy=False)
        h.pool.mark("http://d2", healthy=False)
        with pytest.raises(NoBackend) as raised:
            await h.send(chat("x"))
    assert raised.value.status == 503
    assert raised.value.message == ("no usable decode node: http://d1 is unhealthy; "
                                    "http://d2 is unhealthy")
    assert raised.value.headers["x-ppd-route"] == "pd"
    assert not h.cluster["p1"].received


CLIENT_KV = {"do_remote_prefill": True, "remote_host": "evil.example", "remote_port": 1,
             "remote_block_ids": [9]}


@pytest.mark.parametrize("route", ["pd", "local", "replica", "pd-without-p-params"])
async def test_only_the_proxy_sets_kv_transfer_params(route: str) -> None:
    policy = {"local": Policy.LOCAL, "replica": Policy.REPLICA}.get(route, Policy.PD)
    names = ("r1",) if route == "replica" else ("p1", "d1")
    async with router_over(*names, policy=policy) as h:
        if route == "pd-without-p-params":
            h.cluster["p1"].kv_params = None
        first, content = await h.ask(chat("Hello", kv_transfer_params=CLIENT_KV))
        second, _ = await h.ask(chat("Hello", text_of(content), "next",
                                     kv_transfer_params=CLIENT_KV))
        leg = h.cluster["r1" if route == "replica" else "d1"].received[-1]
    assert second.headers["x-ppd-route"] == route.split("-")[0]
    expected = h.cluster["p1"].kv_params if route == "pd" else None
    params = leg.body.get("kv_transfer_params")
    assert (params and {k: v for k, v in params.items() if k != "remote_request_id"}) == expected
    if route != "replica":
        assert h.cluster["p1"].received[0].body["kv_transfer_params"] == P_KV_TRANSFER_PARAMS


async def test_completions_endpoint_and_forced_route() -> None:
    async with router_over("p1", "d1", policy=Policy.PD) as h:
        prompt = "User: hi\nAssistant:"
        first, content = await h.ask({"model": "fake-model", "prompt": prompt, "max_tokens": 4},
                                     endpoint=Endpoint.COMPLETIONS)
        text = json.loads(content)["choices"][0]["text"]
        second, _ = await h.ask({"model": "fake-model", "prompt": prompt + text + "\nUser: more",
                                 "max_tokens": 4}, endpoint=Endpoint.COMPLETIONS,
                                forced=RouteKind.LOCAL)
    assert first.headers["x-ppd-route"] == "pd"
    assert (second.headers["x-ppd-route"], second.headers["x-ppd-turn"]) == ("local", "2")
    assert h.cluster["d1"].received[-1].path == "/v1/completions"


# ---- Sessions under misuse and under identical histories (issue 23, items 3 and 4) ----

async def test_a_forged_continuation_under_anothers_id_never_resets_the_session() -> None:
    async with router_over("p1", "d1", "d2", policy=Policy.LOCAL) as h:
        _, a1 = await h.ask(chat("A's opening", conversation_id="v2"))
        # B: A's opening plus a forged assistant reply, under A's id.
        b, _ = await h.ask(chat("A's opening", "I am a forged reply", "B asks",
                                conversation_id="v2"))
        a2, _ = await h.ask(chat("A's opening", text_of(a1), "A asks", conversation_id="v2"))
    assert (b.headers["x-ppd-turn"], b.headers["x-ppd-route"]) == ("1", "pd")
    assert (a2.headers["x-ppd-turn"], a2.headers["x-ppd-route"]) == ("2", "local")


async def test_a_reused_id_answers_like_an_unused_one() -> None:
    # A client that does not know a conversation's history cannot tell whether its id is used.
    async with router_over("p1", "d1", policy=Policy.LOCAL) as h:
        await h.ask(chat("someone's opening", conversation_id="taken"))
        probes = {}
        for conversation_id in ("taken", "never-used"):
            for body in (chat("someone's opening", conversation_id=conversation_id),
                         chat("a guess", "a reply", "more", conversation_id=conversation_id)):
                reply, _ = await h.ask(body)
                probes.setdefault(conversation_id, []).append(
                    (reply.status, reply.headers["x-ppd-session"], reply.headers["x-ppd-turn"],
                     reply.headers["x-ppd-route"]))
    assert [(s, t, r) for s, _, t, r in probes["taken"]] == [
        (s, t, r) for s, _, t, r in probes["never-used"]] == [(200, "1", "pd")] * 2
    assert {session for _, session, _, _ in probes["taken"]} == {"taken"}
    assert {session for _, session, _, _ in probes["never-used"]} == {"never-used"}


@pytest.mark.parametrize("at_once", [False, True], ids=["one_by_one", "at_once"])
async def test_conversations_with_identical_histories_all_continue_locally(
        at_once: bool) -> None:
    # 20 conversations: same system prompt and opening, identical (greedy) replies.
    async with router_over("p1", "d1", "d2", policy=Policy.LOCAL) as h:
        opening = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]

        def body(*more: dict[str, str]) -> dict[str, object]:
            return {"model": "fake-model", "messages": [*opening, *more], "max_tokens": 16}

        firsts = [await h.ask(body()) for _ in range(20)]
        replies = {text_of(content) for _, content in firsts}
        assert len(replies) == 1  # every turn 1 ran on the same D, so the same reply
        reply = {"role": "assistant", "content": replies.pop()}
        seconds = [body(reply, {"role": "user", "content": f"question {i}"}) for i in range(20)]
        if at_once:
            answered = await asyncio.gather(*(h.ask(b) for b in seconds))
        else:
            answered = [await h.ask(b) for b in seconds]
    routes = [(r.headers["x-ppd-turn"], r.headers["x-ppd-route"]) for r, _ in answered]
    assert routes == [("2", "local")] * 20
