"""Every user-causable failure of the Responses routes is an OpenAI error with its status."""

from __future__ import annotations

from typing import Any

import httpx

from proxy.config.policy_config import Policy
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import config_for, serve_proxy


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param


def turn(**fields: Any) -> dict[str, Any]:
    return {"model": "fake-model", "input": "hi", **fields}


async def test_unknown_and_unstored_ids_are_404(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.LOCAL)) as proxy:
        c = proxy.client
        assert_error(await c.post("/v1/responses", json=turn(previous_response_id="resp_no")),
                     404, "previous_response_id")
        assert_error(await c.get("/v1/responses/resp_no"), 404)
        assert_error(await c.delete("/v1/responses/resp_no"), 404)
        assert_error(await c.get("/v1/responses/resp_no/input_items"), 404)
        unstored = (await c.post("/v1/responses", json=turn(store=False))).json()
        assert unstored["store"] is False
        assert_error(await c.get(f"/v1/responses/{unstored['id']}"), 404)
        assert_error(await c.post("/v1/responses", json=turn(
            previous_response_id=unstored["id"])), 404, "previous_response_id")
        assert_error(await c.get("/v1/conversations/conv_no"), 404)
        assert_error(await c.get("/v1/conversations/conv_no/items"), 404)
        assert_error(await c.post("/v1/conversations/conv_no/items",
                                  json={"items": [{"role": "user", "content": "x"}]}), 404)
        assert_error(await c.delete("/v1/conversations/conv_no"), 404)


async def test_bad_requests_are_400(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.LOCAL)) as proxy:
        c = proxy.client
        first = (await c.post("/v1/responses", json=turn())).json()
        conversation = (await c.post("/v1/conversations", json={})).json()
        assert_error(await c.post("/v1/responses", json=turn(
            previous_response_id=first["id"], conversation=conversation["id"])),
            400, "conversation")
        assert_error(await c.post("/v1/responses", content=b"{not json",
                                  headers={"content-type": "application/json"}), 400)
        assert_error(await c.post("/v1/responses", content=b"[1]"), 400)
        assert_error(await c.post("/v1/responses", json={"input": "no model"}), 400, "model")
        assert_error(await c.post("/v1/responses", json=turn(input=[])), 400, "input")
        assert_error(await c.post("/v1/responses", json=turn(input=[{"role": "robot",
                                                                     "content": "x"}])), 400)
        assert_error(await c.post("/v1/responses", json=turn(input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])), 400)
        assert_error(await c.post("/v1/responses", json=turn(tools=[{"type": "web_search"}])),
                     400, "tools")
        assert_error(await c.post("/v1/responses", json=turn(
            tool_choice={"type": "function", "name": "absent"})), 400, "tool_choice")
        assert_error(await c.post("/v1/responses", json=turn(max_output_tokens=0)), 400,
                     "max_output_tokens")
        assert_error(await c.post("/v1/responses", json=turn(prompt={"id": "x"})), 400,
                     "prompt")
        assert_error(await c.post("/v1/responses", json=turn(model="other-model")), 404)
        assert_error(await c.get("/v1/conversations/"
                                 f"{conversation['id']}/items?limit=0"), 400, "limit")


async def test_oversize_is_413(cluster: dict[str, FakeVLLM]) -> None:
    config = config_for(cluster, Policy.LOCAL, max_body_bytes=4096, max_response_bytes=2500)
    async with serve_proxy(config) as proxy:
        c = proxy.client
        assert_error(await c.post("/v1/responses", json=turn(input="x" * 5000)), 413)
        first = (await c.post("/v1/responses", json=turn(input="y" * 1000))).json()
        assert (await c.get(f"/v1/responses/{first['id']}")).status_code == 200
        # The chain would pass --max-response-bytes: refused before it runs.
        assert_error(await c.post("/v1/responses", json=turn(
            input="z" * 1500, previous_response_id=first["id"])), 413)
        conversation = (await c.post("/v1/conversations", json={})).json()
        assert_error(await c.post(f"/v1/conversations/{conversation['id']}/items",
                                  json={"items": [{"role": "user", "content": "w" * 2600}]}),
                     413)


async def test_the_api_key_guards_stored_state(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.LOCAL, api_key="k")) as proxy:
        c = proxy.client
        assert_error(await c.post("/v1/responses", json=turn()), 401)
        assert_error(await c.get("/v1/conversations/conv_x"), 401)
        ok = await c.post("/v1/responses", json=turn(), headers={"authorization": "Bearer k"})
        assert ok.status_code == 200


async def test_an_answer_that_takes_the_record_over_the_bound_is_returned_unstored(
        cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.LOCAL, max_response_bytes=1500)) as proxy:
        answer = await proxy.client.post("/v1/responses", json=turn(input="q" * 600))
        assert answer.status_code == 200 and answer.json()["store"] is False
        assert answer.json()["output"][0]["content"][0]["text"]
        assert_error(await proxy.client.get(f"/v1/responses/{answer.json()['id']}"), 404)


async def test_a_stream_that_breaks_ends_failed_and_gives_its_claim_back(
        cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.LOCAL)) as proxy:
        first = await proxy.client.post("/v1/responses", json=turn())
        decode = next(n for n in cluster.values() if n.url == first.headers["x-ppd-decode"])
        decode.faults.die_after_chunks = 2
        broken = await proxy.client.post("/v1/responses", json=turn(
            stream=True, previous_response_id=first.json()["id"]))
        kinds = [line[7:] for line in broken.text.splitlines() if line.startswith("event: ")]
        assert kinds[0] == "response.created" and kinds[-1] == "response.failed"
        assert "response.completed" not in kinds
        decode.faults.die_after_chunks = None
        again = await proxy.client.post("/v1/responses", json=turn(
            previous_response_id=first.json()["id"]))
        assert again.headers["x-ppd-session"] == first.headers["x-ppd-session"]
        assert again.headers["x-ppd-turn"] == "2"
