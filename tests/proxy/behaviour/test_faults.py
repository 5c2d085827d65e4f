"""The fault matrix through the Router's seams (mock nodes, fake clock): what each fault of a P
or a D does to the request, to the node, and to the session; no node ever receives the same
X-Request-Id twice, and every in-flight count ends at zero."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from proxy.config.policy_config import Policy
from proxy.shared.errors import NoBackend, UpstreamError, UpstreamTimeout
from proxy.upstream.breaker import Breaker
from proxy.upstream.health import HealthMonitor
from proxy.upstream.relay import Relay
from tests.fakes.mock_vllm import Fault
from tests.proxy.router_harness import Harness, chat, events, read, router_over, text_of


def assert_clean(h: Harness) -> None:
    """No duplicate sends, nothing left in flight (also as the /metrics gauges say)."""
    assert max(h.cluster.request_ids().values(), default=1) == 1, h.cluster.request_ids()
    assert set(h.in_flight().values()) == {0}, h.in_flight()
    exposition = h.router.metrics.exposition().decode()
    assert "ppd_requests_in_flight 0.0" in exposition
    assert re.findall(r"^ppd_node_in_flight\{.*\} (\S+)$", exposition, re.M) == [
        "0.0"] * len(h.pool.nodes())


def ids(h: Harness, name: str) -> list[str]:
    return [r.headers["x-request-id"] for r in h.cluster[name].received]


# ---- P faults: skipped for this request, P's breaker counts, the turn goes on another P ----

@pytest.mark.parametrize("fault", [Fault.status(500), Fault.timeout(), Fault.reset()],
                         ids=["5xx", "timeout", "reset"])
async def test_a_failing_p_is_skipped_for_another_p(fault: Fault) -> None:
    async with router_over("p1", "p2", "d1") as h:
        h.cluster["p1"].script(fault)
        reply, content = await h.ask(chat("x"))
        p1 = h.pool.get("http://p1")
        assert_clean(h)
    assert (reply.status, reply.headers["x-ppd-prefill"]) == (200, "http://p2")
    assert text_of(content) == "Hello from d1, a fake node."
    assert len(h.cluster["p1"].received) == 1  # never resent to the P that may have run it
    assert ids(h, "p2") == ids(h, "d1")  # P2's try has its own id, shared with D
    assert p1 is not None and p1.healthy and p1.circuit.failures == 1


@pytest.mark.parametrize(("fault", "error", "status"), [
    (Fault.status(500), UpstreamError, 502), (Fault.timeout(), UpstreamTimeout, 504),
    (Fault.reset(), UpstreamError, 502)], ids=["5xx", "timeout", "reset"])
async def test_the_only_p_failing_answers_its_error_and_d_is_never_asked(
        fault: Fault, error: type[Exception], status: int) -> None:
    async with router_over("p1", "d1") as h:
        h.cluster["p1"].script(fault)
        with pytest.raises(error) as raised:
            await h.send(chat("x"))
        assert_clean(h)
    assert raised.value.status == status  # type: ignore[attr-defined]
    assert raised.value.headers["x-ppd-route"] == "pd"  # type: ignore[attr-defined]
    assert not h.cluster["d1"].received


async def test_a_slow_p_is_waited_for() -> None:
    async with router_over("p1", "p2", "d1") as h:
        h.cluster["p1"].delay_s = 0.05
        reply, _ = await h.ask(chat("x"))
        assert_clean(h)
    assert (reply.status, reply.headers["x-ppd-prefill"]) == (200, "http://p1")
    assert h.router.metrics.stats()["failovers"] == 0


# ---- A D that answers 200 with a body that is not JSON (issue 23, item 6) ----

async def test_a_non_json_200_from_the_only_d_is_a_502_as_from_p() -> None:
    for bad in ("p1", "d1"):
        async with router_over("p1", "d1") as h:
            h.cluster[bad].script(Fault.garbage())
            with pytest.raises(UpstreamError) as raised:
                await h.send(chat("x"))
            assert_clean(h)
        assert raised.value.status == 502 and "non-JSON" in raised.value.message, bad


async def test_a_non_json_200_from_d_fails_over_to_another_d() -> None:
    async with router_over("p1", "d1", "d2") as h:
        h.cluster["d1"].script(Fault.garbage())
        reply, content = await h.ask(chat("x"))
        assert_clean(h)
    assert (reply.status, reply.headers["x-ppd-decode"]) == (200, "http://d2")
    assert text_of(content) == "Hello from d2, a fake node."


# ---- D faults before the first byte: the turn is redone P->D on another D ----

async def test_a_refused_d_is_down_at_once_and_the_turn_redone_on_another_d() -> None:
    async with router_over("p1", "d1", "d2") as h:
        h.cluster["d1"].script(Fault.refuse())
        reply, _ = await h.ask(chat("x", stream=True))
        await read(reply)
        d1 = h.pool.get("http://d1")
        assert_clean(h)
    assert reply.headers["x-ppd-decode"] == "http://d2"
    assert d1 is not None and not d1.healthy
    assert not h.cluster["d1"].received
    # P ran twice, each time under a fresh id; D2 got the second one and P's fresh params.
    assert len(ids(h, "p1")) == 2 and ids(h, "d2") == ids(h, "p1")[1:]
    assert h.cluster["d2"].received[0].body["kv_transfer_params"]["remote_request_id"] == (
        ids(h, "p1")[1])


@pytest.mark.parametrize("fault", [Fault.reset(), Fault.status(503), Fault.timeout()],
                         ids=["reset", "5xx", "timeout"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_a_d_failing_before_its_first_byte_is_skipped_not_taken_out(
        fault: Fault, stream: bool) -> None:
    async with router_over("p1", "d1", "d2") as h:
        h.cluster["d1"].script(fault)
        reply, content = await h.ask(chat("x", stream=stream))
        d1 = h.pool.get("http://d1")
        assert_clean(h)
    assert (reply.status, reply.headers["x-ppd-decode"]) == (200, "http://d2")
    assert text_of(content) == "Hello from d2, a fake node."
    assert d1 is not None and d1.healthy and d1.circuit.failures == 1
    # D1 may have received the first try: it is never sent again, and D2 gets P's new params.
    assert len(h.cluster["d1"].received) == 1
    first, second = ids(h, "p1")
    assert ids(h, "d1") == [first] and ids(h, "d2") == [second]
    # D2 got the params of the second prefill, never those D1 may have consumed.
    [d1_req], [d2_req] = h.cluster["d1"].received, h.cluster["d2"].received
    assert d1_req.body["kv_transfer_params"]["remote_request_id"] == first
    assert d2_req.body["kv_transfer_params"]["remote_request_id"] == second
    assert (await h.router.sessions.snapshot())[0]["decode"] == "http://d2"


async def test_a_local_turn_on_a_failing_d_is_redone_as_pd_with_fresh_params() -> None:
    async with router_over("p1", "d1", "d2", policy=Policy.LOCAL) as h:
        first, content = await h.ask(chat("Hello"))
        home = first.headers["x-ppd-decode"][7:]
        other = "d2" if home == "d1" else "d1"
        h.cluster[home].script(Fault.reset())
        second, _ = await h.ask(chat("Hello", text_of(content), "more"))
        assert_clean(h)
    assert (second.headers["x-ppd-route"], second.headers["x-ppd-decode"]) == (
        "pd", f"http://{other}")
    assert h.cluster[other].received[-1].body["kv_transfer_params"]["remote_engine_id"] == (
        "engine-p1")


# ---- D faults after the first byte ----

async def test_a_d_dying_mid_stream_ends_with_an_error_event_and_no_done() -> None:
    async with router_over("p1", "d1", "d2") as h:
        h.cluster["d1"].script(Fault.die_after(2))
        reply, content = await h.ask(chat("Hi", stream=True))
        d1 = h.pool.get("http://d1")
        sessions = (await h.router.sessions.snapshot())
        assert_clean(h)
    data = events(content)
    assert reply.status == 200 and len(data) == 3 and "[DONE]" not in data
    assert data[-1] == {"error": {"message": data[-1]["error"]["message"],
                                  "type": "upstream_error", "param": None,
                                  "code": "bad_gateway"}}
    assert "ReadError" in data[-1]["error"]["message"]
    assert sessions == []  # the cut reply is not what D is said to hold
    assert d1 is not None and d1.circuit.failures == 1
    assert not h.cluster["d2"].received  # too late to fail over: the client has bytes
    assert h.router.metrics.stats()["upstream_errors"] == {"decode:midstream": 1}


async def test_a_d_dying_mid_body_of_a_whole_reply_never_answers_200_with_half() -> None:
    async with router_over("p1", "d1") as h:
        h.cluster["d1"].script(Fault.die_after(1))
        with pytest.raises(UpstreamError, match="ReadError") as raised:
            await h.send(chat("Hi"))
        assert_clean(h)
    assert raised.value.status == 502
    assert await h.router.sessions.snapshot() == []
    async with router_over("p1", "d1", "d2") as h:
        h.cluster["d1"].script(Fault.die_after(1))
        reply, content = await h.ask(chat("Hi"))
        assert_clean(h)
    assert (reply.status, text_of(content)) == (200, "Hello from d2, a fake node.")


async def test_a_client_leaving_mid_turn_cancels_both_legs_and_frees_every_slot() -> None:
    async with router_over("p1", "d1") as h:
        # Leaving during the P leg: P's request is cancelled, D is never asked.
        h.cluster["p1"].script(Fault.hang())
        task = asyncio.create_task(h.send(chat("x", stream=True)))
        while not h.cluster["p1"].open:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert h.cluster["p1"].cancelled == 1 and not h.cluster["d1"].received
        # Leaving during D's stream: the relay closes D's response.
        reply = await h.send(chat("y", stream=True))
        assert isinstance(reply.body, Relay)
        await anext(reply.body)
        await reply.body.aclose()
        assert h.cluster["d1"].cancelled == 1
        assert_clean(h)


async def test_all_d_down_answers_503_with_the_reason() -> None:
    async with router_over("p1", "d1", "d2", breaker=Breaker(failures=1)) as h:
        h.pool.mark("http://d1", healthy=False)
        h.cluster["d2"].script(Fault.reset())
        with pytest.raises(UpstreamError):
            await h.send(chat("one"))
        with pytest.raises(NoBackend) as raised:
            await h.send(chat("two"))
        assert_clean(h)
    assert raised.value.status == 503
    assert raised.value.message == (
        "no usable decode node: http://d1 is unhealthy; "
        "http://d2 has its circuit open after 1 failures in a row")


# ---- The circuit breaker ----

async def test_the_breaker_opens_after_n_failures_probes_after_the_cooldown_and_closes() -> None:
    async with router_over("p1", "d1", "d2", breaker=Breaker(failures=3, cooldown_s=10)) as h:
        h.cluster["d1"].script(*[Fault.status(500)] * 3)
        for i in range(3):  # each one fails over to d2; the third strike opens d1
            reply, _ = await h.ask(chat(f"strike {i}"))
            assert reply.headers["x-ppd-decode"] == "http://d2"
        assert h.circuit("d1") == "open"
        assert 'ppd_node_circuit_open{node="http://d1",role="decode"} 1.0' in (
            h.router.metrics.exposition().decode())
        for i in range(3):  # open: d1 is not even tried
            await h.ask(chat(f"open {i}"))
        assert len(h.cluster["d1"].received) == 3
        h.clock.now += 10
        assert h.circuit("d1") == "half_open"
        # Half-open: the next request to pick d1 is its one probe; others stay off it.
        probe = await h.send(chat("probe", stream=True))
        assert probe.headers["x-ppd-decode"] == "http://d1"
        while_probing, _ = await h.ask(chat("meanwhile"))
        assert while_probing.headers["x-ppd-decode"] == "http://d2"
        await read(probe)  # the probe succeeds: closed
        assert h.circuit("d1") == "closed"
        assert h.pool.get("http://d1").circuit.failures == 0  # type: ignore[union-attr]
        assert_clean(h)


async def test_a_failed_probe_opens_the_circuit_again_for_a_new_cooldown() -> None:
    async with router_over("p1", "d1", "d2", breaker=Breaker(failures=1, cooldown_s=10)) as h:
        h.cluster["d1"].script(Fault.reset(), Fault.reset())
        await h.ask(chat("strike"))
        h.clock.now += 10
        reply, _ = await h.ask(chat("probe"))  # the probe fails over to d2
        assert reply.headers["x-ppd-decode"] == "http://d2"
        assert len(h.cluster["d1"].received) == 2
        assert h.circuit("d1") == "open"
        h.clock.now += 9
        await h.ask(chat("still open"))
        assert len(h.cluster["d1"].received) == 2
        h.clock.now += 1
        reply, _ = await h.ask(chat("second probe"))
        assert reply.headers["x-ppd-decode"] == "http://d1"
        assert h.circuit("d1") == "closed"
        assert_clean(h)


async def test_an_abandoned_probe_lets_the_next_request_probe() -> None:
    async with router_over("p1", "d1", breaker=Breaker(failures=1, cooldown_s=10)) as h:
        h.cluster["d1"].script(Fault.reset())
        with pytest.raises(UpstreamError):
            await h.send(chat("strike"))
        h.clock.now += 10
        probe = await h.send(chat("probe", stream=True))
        assert isinstance(probe.body, Relay)
        await probe.body.aclose()  # the client left: no verdict
        reply, _ = await h.ask(chat("next"))
        assert reply.headers["x-ppd-decode"] == "http://d1"
        assert h.circuit("d1") == "closed"
        assert_clean(h)


async def test_a_probe_whose_p_leg_failed_leaves_the_circuit_probe_able() -> None:
    async with router_over("p1", "d1", breaker=Breaker(failures=1, cooldown_s=10)) as h:
        h.cluster["d1"].script(Fault.reset())
        with pytest.raises(UpstreamError):
            await h.send(chat("strike"))
        h.clock.now += 10
        h.cluster["p1"].script(Fault.reset())
        with pytest.raises(UpstreamError, match="p1"):
            await h.send(chat("d1 picked as the probe, but P fails"))
        assert h.circuit("d1") == "half_open"
        h.clock.now += 10  # P's circuit (one strike opens it here) is half-open again too
        reply, _ = await h.ask(chat("the next request probes"))
        assert reply.headers["x-ppd-decode"] == "http://d1"
        assert h.circuit("d1") == "closed"
        assert_clean(h)


async def test_a_node_healthy_to_health_checks_but_failing_completions_is_broken() -> None:
    async with router_over("p1", "d1", "d2", breaker=Breaker(failures=3)) as h:
        h.cluster["d1"].script(*[Fault.status(500)] * 100)
        replies = [await h.ask(chat(f"c{i}")) for i in range(10)]
        async with httpx.AsyncClient(transport=h.cluster.transport) as probes:
            await HealthMonitor(h.pool, probes, interval=60).check_all()
        assert_clean(h)
    assert all(reply.status == 200 for reply, _ in replies)
    assert len(h.cluster["d1"].received) == 3  # then its circuit kept it out
    assert h.pool.get("http://d1").healthy  # type: ignore[union-attr]
    assert h.circuit("d1") == "open"


async def test_sporadic_5xx_never_take_a_d_out() -> None:
    # The case: one request in a few makes D answer 5xx; D must stay in the pool.
    async with router_over("p1", "d1", "d2") as h:
        for i in range(30):
            if i % 3 == 0:
                h.cluster["d1"].script(Fault.status(500))
            reply, _ = await h.ask(chat(f"c{i}"))
            assert reply.status == 200
        assert_clean(h)
    assert h.router.metrics.stats()["upstream_errors"] == {"decode:status": 10}
    assert {h.circuit("d1"), h.circuit("d2")} == {"closed"}
    assert all(n.healthy for n in h.pool.nodes())


# ---- A stream past its max_tokens is the node's fault (issue 23, item 5) ----

async def test_a_stream_past_its_max_tokens_is_cut_and_charged_to_d() -> None:
    async with router_over("p1", "d1") as h:
        h.cluster["d1"].script(Fault.endless())
        reply, content = await h.ask(chat("x", stream=True, max_tokens=4))
        d1 = h.pool.get("http://d1")
        assert_clean(h)
    got = events(content)
    assert reply.status == 200 and "[DONE]" not in got
    assert "max_tokens" in got[-1]["error"]["message"]
    tokens = [e for e in got[:-1] if e["choices"][0]["delta"].get("content")]
    assert len(tokens) <= 5  # the cap, and at most the event that crossed it
    assert d1 is not None and d1.circuit.failures == 1
    assert not (await h.router.sessions.snapshot())  # a cut reply is not recorded


async def test_a_whole_answer_past_its_max_tokens_is_a_502_charged_to_d() -> None:
    async with router_over("p1", "d1") as h:
        h.cluster["d1"].script(Fault.endless())
        with pytest.raises(UpstreamError, match="max_tokens"):
            await h.ask(chat("x", max_tokens=4))
        d1 = h.pool.get("http://d1")
        assert_clean(h)
    assert d1 is not None and d1.circuit.failures == 1
    assert not (await h.router.sessions.snapshot())


# ---- A request-caused failure is not a node fault (issue 23, item 2) ----

async def test_requests_that_make_every_d_answer_500_lock_nobody_out() -> None:
    async with router_over("p1", "d1", "d2", breaker=Breaker(failures=3)) as h:
        for i in range(10):  # a "poison" request: both Ds answer it 500
            h.cluster["d1"].script(Fault.status(500))
            h.cluster["d2"].script(Fault.status(500))
            with pytest.raises(UpstreamError) as raised:
                await h.send(chat(f"poison {i}"))
            assert raised.value.status == 502
        others = [await h.ask(chat(f"someone else {i}")) for i in range(4)]
        assert_clean(h)
    assert [reply.status for reply, _ in others] == [200] * 4
    assert {h.circuit("d1"), h.circuit("d2")} == {"closed"}
    assert len(h.cluster["d1"].received) + len(h.cluster["d2"].received) == 24


async def test_one_request_failing_on_several_nodes_counts_at_most_once() -> None:
    async with router_over("p1", "d1", "d2", breaker=Breaker(failures=3)) as h:
        h.cluster["d1"].script(Fault.reset())
        h.cluster["d2"].script(Fault.reset())
        with pytest.raises(UpstreamError):
            await h.send(chat("resets both"))
        strikes = {name: h.pool.get(f"http://{name}").circuit.failures  # type: ignore[union-attr]
                   for name in ("d1", "d2")}
        assert_clean(h)
    assert sorted(strikes.values()) == [0, 1]


async def test_5xx_from_one_d_across_different_requests_open_its_circuit() -> None:
    # The others serve the same requests: each 500 is d1's, and three in a row take it out.
    async with router_over("p1", "d1", "d2", breaker=Breaker(failures=3)) as h:
        h.cluster["d1"].script(*[Fault.status(500)] * 3)
        for i in range(3):
            reply, _ = await h.ask(chat(f"request {i}"))
            assert reply.headers["x-ppd-decode"] == "http://d2"
        assert_clean(h)
    assert h.circuit("d1") == "open" and h.circuit("d2") == "closed"
