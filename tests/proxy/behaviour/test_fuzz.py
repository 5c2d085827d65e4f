"""Property-based fuzzing of both completion endpoints: 1,100 hostile requests in process (mock
nodes, no sockets) and 200 more over a real socket (where header bytes are encoded); every
answer a clean 4xx or a valid completion, the proxy still up and idle afterwards.
`make fuzz` (benchmarks/fuzz.py) runs the same property on 10,000+ cases."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, reject, settings

from proxy import NodeSpec, PolicyConfig, ProxyConfig, Role, ServerThread, create_app
from proxy.config.policy_config import Policy
from proxy.shared.errors import BadRequest
from proxy.shared.validate import MAX_DEPTH, parse_json_object
from tests.fakes.mock_vllm import MockCluster
from tests.proxy.behaviour.fuzz_cases import ADMIN_KEY, Case, cases, check_answer, fuzz_target

SUITE_CASES = 1100
FUZZ_SETTINGS = settings(max_examples=SUITE_CASES, deadline=None, database=None,
                         suppress_health_check=list(HealthCheck))


def test_every_hostile_request_gets_a_clean_4xx_or_a_valid_completion() -> None:
    with fuzz_target() as target:
        seen: list[Case] = []

        @FUZZ_SETTINGS
        @given(case=cases())
        def property_holds(case: Case) -> None:
            seen.append(case)
            target.check(case)

        property_holds()
        # Still up and idle: a plain request is served, nothing is left in flight.
        status, _, body = target.send(Case("POST", "/v1/chat/completions", {}, json.dumps(
            {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}).encode()))
        assert status == 200, body
        assert set(target.in_flight().values()) == {0}, target.in_flight()
    assert len(seen) >= 1000
    # The run exercised both outcomes, not only rejections.
    assert target.answered.get(200, 0) > 50 and target.answered.get(400, 0) > 50, target.answered


def test_on_a_real_socket_too() -> None:
    # The Quart test client never encodes headers; here they go out as Latin-1 bytes, and the
    # proxy's own headers (x-ppd-session carries a client-chosen id) must encode too.
    cluster = MockCluster("p1", "d1", "d2")
    nodes = tuple(NodeSpec(n.url, Role.PREFILL if name[0] == "p" else Role.DECODE)
                  for name, n in cluster.nodes.items())
    config = ProxyConfig(nodes=nodes, policy=PolicyConfig(Policy.LOCAL), port=0,
                         health_interval=600, admin_key=ADMIN_KEY, max_body_bytes=1024 * 1024)
    answered: dict[int, int] = {}
    with ServerThread(create_app(config, transport=cluster.transport)) as server, \
            httpx.Client(base_url=server.url, timeout=30) as client:

        @settings(FUZZ_SETTINGS, max_examples=200)
        @given(case=cases())
        def property_holds(case: Case) -> None:
            headers = {k: v.encode("latin-1") for k, v in case.headers.items()
                       if k not in ("host", "content-encoding")}
            try:
                response = client.request(case.method, case.path, content=case.body,
                                          headers=headers)
            except httpx.LocalProtocolError:
                # h11 refuses to send it (e.g. a header value with a NUL or edge whitespace):
                # no HTTP/1.1 client can put this case on the wire, so it proves nothing here.
                reject()
            answered[response.status_code] = answered.get(response.status_code, 0) + 1
            check_answer(response.status_code, response.headers.get("content-type", ""),
                         response.content)

        property_holds()
        assert client.get("/health").status_code == 200
    assert answered.get(200, 0) > 5, answered


# Each class the issue measured as a proxy-made 500, as a named case.
POISON = {
    "invalid utf-8": b'{"messages": [{"role": "user", "content": "\xff"}]}',
    "encoded surrogate": b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
    "escaped surrogate in content": b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
    "surrogate in a key": b'{"messages": [{"role": "user", "\\udc00": 1}]}',
    "surrogate in conversation_id": b'{"messages": [{"role": "user"}], '
                                    b'"conversation_id": "a\\udfffb"}',
    "surrogate in a prompt": b'{"prompt": "x\\ud83d"}',
    "NaN": b'{"messages": [{"role": "user"}], "temperature": NaN}',
    "Infinity": b'{"messages": [{"role": "user"}], "temperature": -Infinity}',
    "1e999": b'{"messages": [{"role": "user"}], "temperature": 1e999}',
    "5000-digit max_tokens": b'{"messages": [{"role": "user"}], "max_tokens": ' + b"9" * 5000
                             + b"}",
    "nested 1000 deep": b'{"messages": [{"role": "user"}], "x": ' + b"[" * 1000 + b"]" * 1000
                        + b"}",
    "nested 100000 deep": b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "utf-16": '{"prompt": "x"}'.encode("utf-16"),
}


@pytest.mark.parametrize("raw", POISON.values(), ids=POISON.keys())
def test_each_poison_class_is_a_400_with_an_openai_error(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_json_object(raw)
    with fuzz_target() as target:
        for path in ("/v1/chat/completions", "/v1/completions"):
            status, content_type, body = target.send(Case("POST", path, {}, raw))
            check_answer(status, content_type, body)
            assert status == 400, body


def test_the_limits_themselves_are_accepted() -> None:
    nested = b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1)
    assert parse_json_object(b'{"x": ' + nested + b', "n": ' + b"9" * 64 + b', "t": 1e308, '
                             b'"s": "\\ud83d\\ude00 \xc3\xa9"}')["s"] == "\U0001F600 \u00e9"
    with pytest.raises(BadRequest, match="nested"):
        parse_json_object(b'{"x": [' + nested + b"]}")


def test_a_request_refused_on_its_headers_gets_its_answer_despite_a_large_body() -> None:
    # Found by the socket fuzzing: a 400 for the header sent before the body was read, then
    # the connection closed under the client's feet ("Server disconnected"), now and then.
    cluster = MockCluster("p1", "d1")
    config = ProxyConfig(nodes=(NodeSpec("http://p1", Role.PREFILL),
                                NodeSpec("http://d1", Role.DECODE)), port=0, health_interval=600,
                         admin_key="adm")  # without one the header is ignored, not refused
    body = json.dumps({"model": "fake-model", "messages": [
        {"role": "user", "content": "x" * 100} for _ in range(5000)]}).encode()
    with ServerThread(create_app(config, transport=cluster.transport)) as server, \
            httpx.Client(base_url=server.url, timeout=30) as client:
        for _ in range(10):
            response = client.post("/v1/chat/completions", content=body,
                                   headers={"x-ppd-route": "replica"})
            assert response.status_code == 400
            assert "x-ppd-route" in response.json()["error"]["message"]
