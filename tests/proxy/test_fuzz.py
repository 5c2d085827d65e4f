"""Property-based fuzzing of both completion endpoints (in process, mock nodes, no sockets):
1,100 hostile requests, every answer a clean 4xx or a valid completion, the proxy still up and
idle afterwards. `make fuzz` (benchmarks/fuzz.py) runs the same property on 10,000+ cases."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings

from proxy.errors import BadRequest
from proxy.validate import MAX_DEPTH, parse_json_object
from tests.proxy.fuzz_cases import Case, cases, check_answer, fuzz_target

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
