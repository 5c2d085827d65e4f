"""The five anchor policies behind the real proxy (fake vLLM nodes, one P and two Ds): three
turns of two conversations each succeed, turn 1 goes P->D, every turn runs on nodes the
policy may name, and the rules' routes show where they differ - a 2-token follow-up is under
llm-d's 16, vllm-router's 256 and Dynamo's 2,048, and vllm-example reads every later turn
back (P->D here: the fakes keep no blocks for it)."""

from __future__ import annotations

import httpx
import pytest

from proxy import create_app
from proxy.config.settings import config_from_args
from proxy.serving.server import running
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import chat_body, reply_text

ANCHORS = ("llm-d", "llm-d-sticky", "dynamo", "vllm-router", "vllm-example")


async def _routes(policy: str) -> list[tuple[int, str, str]]:
    async with FakeVLLM("p") as p, FakeVLLM("d0") as d0, FakeVLLM("d1") as d1:
        config = config_from_args(["--policy", policy, "--prefill", p.url, "--decode",
                                   d0.url, "--decode", d1.url, "--port", "0"])
        seen = []
        async with running(create_app(config)) as server, \
                httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            for opening in ("Hello there", "Goodbye now"):
                history = [opening]
                for _ in range(3):
                    answer = await client.post("/v1/chat/completions", json=chat_body(*history))
                    assert answer.status_code == 200, answer.text
                    assert answer.headers["x-ppd-decode"] in (d0.url, d1.url)
                    seen.append((int(answer.headers["x-ppd-turn"]),
                                 answer.headers["x-ppd-route"], answer.headers["x-ppd-decode"]))
                    history += [reply_text(answer), "ok"]
        return seen


@pytest.mark.parametrize("policy", ANCHORS)
async def test_an_anchor_serves_every_turn_through_the_proxy(policy: str) -> None:
    seen = await _routes(policy)
    assert [turn for turn, _, _ in seen] == [1, 2, 3, 1, 2, 3]
    assert all(route == "pd" for turn, route, _ in seen if turn == 1)
    later = {route for turn, route, _ in seen if turn > 1}
    if policy == "vllm-example":
        assert later == {"pd"}  # readback_missing: nothing kept to read back
    else:
        assert later == {"local"}
