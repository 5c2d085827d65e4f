"""`ppd replay --api responses`: every turn through the proxy's Responses API, naming the
previous response; the proxy continues each conversation as one session; the run says so."""

from __future__ import annotations

import json
from pathlib import Path

from profiler.replay import ReplayConfig, replay
from profiler.replay.metrics import summarize
from profiler.replay.output import write_run
from profiler.replay.request_bodies import Api, History, parse_responses_payload
from profiler.traces import Conversation, Turn
from proxy import ProxyConfig, create_app
from proxy.config.cluster_file import NodeSpec
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.serving.server import running
from proxy.shared.vocabulary import Role
from tests.fakes.fake_vllm import FakeVLLM


def _conversations(count: int, turns: int) -> list[Conversation]:
    return [Conversation(id=f"conv{i}", system="Answer briefly." if i == 0 else None,
                         turns=tuple(Turn(f"conversation {i} asks question {k}", "ref", 8)
                                     for k in range(1, turns + 1)))
            for i in range(count)]


def test_a_responses_turn_sends_its_new_text_and_names_the_previous_response() -> None:
    history = History(Api.RESPONSES, "Be brief.")
    history.add_user("first")
    assert history.body("m", 8, ignore_eos=True) == {
        "model": "m", "input": "first", "max_output_tokens": 8, "stream": True,
        "instructions": "Be brief.", "ignore_eos": True}
    history.add_reply("answer", "resp_1")
    history.add_user("second")
    body = history.body("m", 8, ignore_eos=False)
    assert (body["input"], body["previous_response_id"]) == ("second", "resp_1")
    assert Api.RESPONSES.path == "/v1/responses"


def test_responses_payloads_are_read_as_text_usage_id_and_errors() -> None:
    assert parse_responses_payload({"type": "response.output_text.delta", "delta": "hi"}).text \
        == "hi"
    done = parse_responses_payload({"type": "response.completed", "response": {
        "id": "resp_9", "usage": {"input_tokens": 5, "output_tokens": 2}, "output": []}})
    assert (done.done, done.response_id, done.usage) == (
        True, "resp_9", {"prompt_tokens": 5, "completion_tokens": 2})
    failed = parse_responses_payload({"type": "response.failed", "response": {
        "error": {"message": "D broke"}}})
    assert failed.error == "upstream error: D broke"
    whole = parse_responses_payload({"id": "resp_2", "output": [
        {"type": "message", "content": [{"type": "output_text", "text": "whole"}]}]})
    assert (whole.text, whole.response_id, whole.done) == ("whole", "resp_2", True)
    assert parse_responses_payload([1]).error


async def test_replay_through_the_responses_api_continues_every_conversation(
        tmp_path: Path) -> None:
    async with FakeVLLM("p") as p, FakeVLLM("d") as d:
        config = ProxyConfig(nodes=(NodeSpec(p.url, Role.PREFILL), NodeSpec(d.url, Role.DECODE)),
                             policy=PolicyConfig(kind=Policy.LOCAL), port=0)
        async with running(create_app(config)) as proxy:
            result = await replay(_conversations(3, turns=3), ReplayConfig(
                target=proxy.url, qps=30.0, duration_s=0.2, max_conversations=3,
                api="responses", timeout_s=10.0, whole_turns=(2,)))
    records = result.records
    assert len(records) == 9 and all(r.success for r in records), [r.error for r in records]
    for record in records:
        assert record.proxy_turn == record.turn  # one session per conversation, by identity
        assert record.route == ("pd" if record.turn == 1 else "local")
        assert record.n_input_tokens and record.n_output_tokens >= 1
    assert len(p.completions) == 3  # P saw turn 1 of each conversation only
    # D got each turn's whole history, built by the proxy from the chain
    last = d.completions[-1].body["messages"]
    assert [m["role"] for m in last if m["role"] != "system"] == ["user", "assistant"] * 2 + [
        "user"]
    summary = summarize(records, result.wall_time_s)
    write_run(tmp_path, result, summary, label="responses", dataset="synthetic")
    document = json.loads((tmp_path / "summary.json").read_text())
    assert document["api"] == "responses" and document["config"]["api"] == "responses"
