"""The replay client against the in-process fake timed server (real HTTP on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import random
import statistics

import httpx
import pytest

from profiler.replay import ReplayConfig, ReplayError, replay
from profiler.replay.request_bodies import ASSISTANT_PREFIX, USER_PREFIX
from profiler.traces import Conversation, Turn, two_turn_conversations
from profiler.traces.arrivals import arrival_times
from proxy.shared.discretize import Shape
from tests.exports import assert_exports
from tests.fakes.fake_openai_timed import MODEL, FakeTimedServer, serve


def _conversations(count: int, turns: int = 2, n_out: int = 6) -> list[Conversation]:
    return [
        Conversation(
            id=f"c{i}",
            turns=tuple(Turn(f"question {k} of conversation {i}", "ref", n_out)
                        for k in range(1, turns + 1)),
            system="you are terse" if i == 0 else None,
        )
        for i in range(count)
    ]


def _config(url: str, **overrides: object) -> ReplayConfig:
    values: dict = {"target": url, "qps": 50.0, "duration_s": 0.1, "max_conversations": 2}
    values.update(overrides)
    return ReplayConfig(**values)


async def test_ttft_and_tpot_match_injected_delays() -> None:
    app = FakeTimedServer(ttft_s=0.15, itl_s=0.03)
    async with serve(app) as url:
        result = await replay(_conversations(2, n_out=8), _config(url))
    assert len(result.records) == 4
    for record in result.records:
        assert record.success, record.error
        assert record.n_output_tokens == 8
        assert record.ttft_s == pytest.approx(0.15, abs=0.06)
        assert record.tpot_s == pytest.approx(0.03, abs=0.012)
        assert len(record.itl_s) == 7
        assert statistics.mean(record.itl_s) == pytest.approx(0.03, abs=0.012)
        assert record.e2e_s == pytest.approx(0.15 + 7 * 0.03, abs=0.1)
        assert record.n_input_tokens == 7 * record.turn  # from the usage chunk


async def test_turn_k_plus_1_history_holds_the_actual_turn_k_reply() -> None:
    app = FakeTimedServer(ttft_s=0.0, itl_s=0.0)
    async with serve(app) as url:
        result = await replay(_conversations(1, turns=3), _config(url, max_conversations=1))
    assert [r.turn for r in result.records] == [1, 2, 3]
    first, second, third = app.bodies
    assert first["messages"] == [{"role": "system", "content": "you are terse"},
                                 {"role": "user", "content": "question 1 of conversation 0"}]
    # turn 2 = turn 1's messages + the reply exactly as streamed + the new question
    assert second["messages"][:2] == first["messages"]
    assert second["messages"][2] == {"role": "assistant", "content": app.replies[0]}
    assert second["messages"][3]["content"] == "question 2 of conversation 0"
    assert third["messages"][4] == {"role": "assistant", "content": app.replies[1]}
    for body in app.bodies:
        assert body["model"] == MODEL  # taken from GET /v1/models
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["ignore_eos"] is True and body["max_tokens"] == 6
    assert {h["x-session-id"] for h in app.headers} == {"c0"}


async def test_completions_prompt_continues_the_previous_prompt_plus_reply() -> None:
    app = FakeTimedServer(ttft_s=0.0, itl_s=0.0)
    async with serve(app) as url:
        result = await replay(_conversations(2, turns=2)[1:],
                              _config(url, api="completions", max_conversations=1))
    assert all(r.success for r in result.records)
    first, second = (body["prompt"] for body in app.bodies)
    assert first == f"{USER_PREFIX}question 1 of conversation 1\n\n{ASSISTANT_PREFIX}"
    assert second.startswith(first + app.replies[0])
    assert second.endswith(f"{USER_PREFIX}question 2 of conversation 1\n\n{ASSISTANT_PREFIX}")


async def test_max_tokens_is_the_reference_length_capped_and_max_turns() -> None:
    app = FakeTimedServer(ttft_s=0.0, itl_s=0.0)
    conversations = two_turn_conversations(Shape(8, 40), "tiny", 1, seed=0)  # 40 then 32
    async with serve(app) as url:
        result = await replay(conversations, _config(url, max_tokens_cap=35, max_turns=2,
                                                     ignore_eos=False, max_conversations=1))
    assert [body["max_tokens"] for body in app.bodies] == [35, 32]
    assert "ignore_eos" not in app.bodies[0]
    async with serve(app) as url:
        result = await replay(conversations, _config(url, max_turns=1, max_conversations=1))
    assert [r.turn for r in result.records] == [1]


async def test_routes_and_nodes_come_from_proxy_headers() -> None:
    app = FakeTimedServer(ttft_s=0.0, itl_s=0.0, route="pd")

    def force_local_after_turn1(turn: int) -> dict[str, str]:
        return {"x-ppd-route": "local"} if turn >= 2 else {}

    async with serve(app) as url:
        result = await replay(_conversations(1), _config(
            url, max_conversations=1, headers_for_turn=force_local_after_turn1))
    turn1, turn2 = result.records
    assert (turn1.route, turn1.prefill, turn1.decode) == ("pd", app.prefill, app.decode)
    assert (turn2.route, turn2.prefill, turn2.decode) == ("local", None, app.decode)
    assert (turn1.proxy_turn, turn2.proxy_turn) == (1, 2)
    assert app.headers[1]["x-ppd-route"] == "local"


async def test_timeout_is_a_failed_record_and_ends_the_conversation() -> None:
    app = FakeTimedServer(ttft_s=0.0, itl_s=0.0, stall_after_tokens=2)
    async with serve(app) as url:
        result = await replay(_conversations(1), _config(url, timeout_s=0.3, max_conversations=1))
    assert len(result.records) == 1  # turn 2 never sent: there is no complete reply
    record = result.records[0]
    assert not record.success and record.error is not None and "timeout" in record.error
    assert record.status == 200 and record.n_output_tokens == 2
    assert record.e2e_s == pytest.approx(0.3, abs=0.15)


async def test_http_errors_and_refused_connections_are_failures() -> None:
    app = FakeTimedServer(status=503)
    async with serve(app) as url:
        result = await replay(_conversations(2), _config(url, model="m"))
    assert [(r.success, r.status) for r in result.records] == [(False, 503), (False, 503)]
    assert all("injected failure" in (r.error or "") for r in result.records)

    async with serve(FakeTimedServer()) as url:
        pass  # the port is closed again: nothing listens there now
    result = await replay(_conversations(1), _config(url, model="m", max_conversations=1))
    (record,) = result.records
    assert not record.success and record.status is None and record.error


async def test_no_model_at_the_target_is_a_clear_error() -> None:
    def no_models(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": {"message": "nope"}})

    with pytest.raises(ReplayError, match="cannot get a model"):
        await replay(_conversations(1), _config("http://127.0.0.1:9"),
                     transport=httpx.MockTransport(no_models))


def test_poisson_arrivals_have_the_configured_mean_rate() -> None:
    times = arrival_times(4.0, 5000.0, random.Random(11))
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert len(times) == pytest.approx(20000, rel=0.03)
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.03)
    # exponential gaps: standard deviation equals the mean
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.05)
    assert times == arrival_times(4.0, 5000.0, random.Random(11))


def test_bursty_arrivals_keep_the_mean_and_widen_the_spread() -> None:
    times = arrival_times(4.0, 5000.0, random.Random(3), burstiness=0.25)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.06)
    assert statistics.stdev(gaps) > 1.7 * statistics.mean(gaps)  # cv = 1/sqrt(0.25) = 2
    assert len(arrival_times(4.0, 5000.0, random.Random(3), max_count=10)) == 10


async def test_arrivals_follow_the_injected_clock() -> None:
    """The client sleeps until each arrival on its clock; a virtual clock makes it instant."""
    now = [0.0]
    slept: list[float] = []

    async def virtual_sleep(seconds: float) -> None:
        # like a real sleep: the tasks already started run first, then the time passes
        await asyncio.sleep(0)
        slept.append(seconds)
        now[0] += seconds

    def ok(request: httpx.Request) -> httpx.Response:
        body = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, content=body)

    config = _config("http://127.0.0.1:9", qps=2.0, duration_s=50.0, max_conversations=None,
                     model="m", seed=5)
    result = await replay(_conversations(3, turns=1), config,
                          transport=httpx.MockTransport(ok),
                          clock=lambda: now[0], sleep=virtual_sleep)
    expected = arrival_times(2.0, 50.0, random.Random(5))
    assert result.n_conversations == len(expected) == len(result.records)
    assert [r.start_s for r in result.records] == pytest.approx(expected)
    assert result.wall_time_s == pytest.approx(expected[-1])
    assert sum(slept) == pytest.approx(expected[-1])  # no wall-clock waiting happened
    assert {r.conversation_id for r in result.records} >= {"c0", "c0#1"}  # repeats get new ids


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="http"):
        ReplayConfig(target="127.0.0.1:8000", qps=1, duration_s=1)
    with pytest.raises(ValueError):
        ReplayConfig(target="http://x", qps=0, duration_s=1)
    with pytest.raises(ValueError):
        ReplayConfig(target="http://x", qps=1, duration_s=1, api="grpc")  # type: ignore[arg-type]


def test_public_exports_are_sorted_and_resolve() -> None:
    import profiler.replay as package

    assert_exports(package, {"ReplayConfig", "ReplayError", "ReplayResult", "replay"})


async def test_a_stop_ends_the_run_with_the_turns_completed_so_far() -> None:
    from profiler.traces.synthetic import named_workload

    app = FakeTimedServer(ttft_s=0.005, itl_s=0.001)
    async with serve(app) as url:
        stop = asyncio.Event()
        config = ReplayConfig(target=url, qps=20.0, duration_s=600.0, max_tokens_cap=4)
        conversations = named_workload("small-tiny", 50, seed=0)

        async def stop_after_some_turns() -> None:
            # Once the server has answered 4 turns whole: on a loaded machine more are in
            # flight by then, and the stop abandons those.
            while len(app.replies) < 4:
                await asyncio.sleep(0.01)
            stop.set()

        stopper = asyncio.create_task(stop_after_some_turns())
        result = await asyncio.wait_for(replay(conversations, config, stop=stop), 60)
        await stopper
    assert result.interrupted
    # The turns the client had read to the end are kept (how many of the server's 4 answers
    # it had read when the stop came depends on scheduling); none it never sent.
    assert 1 <= len(result.records) <= len(app.bodies)
    assert all(record.success for record in result.records)
    assert result.n_conversations >= 3


async def test_whole_turns_are_sent_without_streaming_and_keep_the_history() -> None:
    app = FakeTimedServer(ttft_s=0.05, itl_s=0.01)
    async with serve(app) as url:
        result = await replay(_conversations(1, turns=2, n_out=5),
                              _config(url, max_conversations=1, whole_turns=(1,)))
    first, second = result.records
    assert first.success and second.success, (first.error, second.error)
    assert app.bodies[0]["stream"] is False and "stream_options" not in app.bodies[0]
    assert app.bodies[1]["stream"] is True
    # The whole answer: its TTFT is the whole time, no TPOT; its text goes into turn 2.
    assert first.ttft_s == pytest.approx(0.05 + 4 * 0.01, abs=0.05) and first.tpot_s is None
    assert first.n_output_tokens == 5 and first.n_input_tokens == 7
    assert app.bodies[1]["messages"][-2] == {"role": "assistant", "content": app.replies[0]}
    assert second.tpot_s is not None
