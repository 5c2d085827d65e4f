"""proxy.shared.validate alone: the strict JSON reading and the fields the proxy relies on, each
refusal a 400 that names the field at fault."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.shared.errors import BadRequest
from proxy.shared.validate import MAX_DEPTH, Endpoint, parse_json_object, validate_body


@pytest.mark.parametrize(("raw", "why"), [
    (b"\xff{}", "not valid UTF-8"),
    (b'{"a": NaN}', "not valid JSON"),
    (b'{"a": 1e999}', "not valid JSON"),
    (b'{"a": "\\ud800"}', "lone surrogate"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"a": ' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}", "nested more than"),
])
def test_what_json_allows_but_the_proxy_cannot_forward_is_refused(raw: bytes, why: str) -> None:
    with pytest.raises(BadRequest, match=why):
        parse_json_object(raw)


def test_a_plain_object_is_read_as_is() -> None:
    assert parse_json_object(b'{"model": "m", "seed": 12345678901234567890}') == {
        "model": "m", "seed": 12345678901234567890}


@pytest.mark.parametrize(("endpoint", "body", "param"), [
    (Endpoint.CHAT, {"messages": []}, "messages"),
    (Endpoint.CHAT, {"messages": [{"content": "no role"}]}, "messages[0]"),
    (Endpoint.COMPLETIONS, {"prompt": 7}, "prompt"),
    (Endpoint.CHAT, {"messages": [{"role": "user", "content": "x"}], "stream": "yes"},
     "stream"),
    (Endpoint.CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": True},
     "max_tokens"),
    (Endpoint.CHAT, {"messages": [{"role": "user", "content": "x"}], "model": 3}, "model"),
])
def test_a_field_the_proxy_relies_on_is_checked_and_named(endpoint: Endpoint,
                                                         body: dict[str, Any],
                                                         param: str) -> None:
    with pytest.raises(BadRequest) as refused:
        validate_body(endpoint, body)
    assert refused.value.param == param and refused.value.status == 400


def test_fields_the_proxy_does_not_read_pass_through_unchecked() -> None:
    validate_body(Endpoint.CHAT, {"messages": [{"role": "user", "content": "x"}],
                                  "temperature": "whatever vLLM says", "max_tokens": 5})
    validate_body(Endpoint.COMPLETIONS, {"prompt": ["a", "b"], "logit_bias": {"1": 2}})
