"""parse_json_object reads a body with orjson first: it must accept exactly what the standard
library's path (with its hooks) accepts, to the same value, and refuse the rest with the same
error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.shared.errors import BadRequest
from proxy.shared.validate import _parse_with_stdlib, _plain_text, parse_json_object


def _outcome(parse: Any, raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", parse(raw)
    except BadRequest as exc:
        return "refused", exc.message


def _same(raw: bytes) -> None:
    fast, reference = _outcome(parse_json_object, raw), _outcome(_parse_with_stdlib, raw)
    assert fast == reference, raw[:200]
    if fast[0] == "ok":  # same types too: an int stays an int, a float a float
        assert json.dumps(fast[1]) == json.dumps(reference[1])


EDGES = [
    b'{"a": 18446744073709551615}', b'{"a": 18446744073709551616}', b'{"a": -9223372036854775809}',
    b'{"a": "' + b"1" * 30 + b'"}', b'{"a": 1e999}', b'{"a": -1e999}', b'{"a": 1.5e308}',
    b'{"a": NaN}', b'{"a": Infinity}', b'{"a": "\\ud800"}', b'{"a": "\xed\xa0\x80"}',
    b'{"a": "\xff"}', b'\xef\xbb\xbf{"a": 1}', b'{"a": 1, "a": 2}', b'{"a": -0}',
    b'{"a": 0.1}', b'{"a": "\\u0000"}', b'{"a": "\x01"}', b' {"a": 1} ', b'{"a": 1}\x00',
    b"[]", b"null", b'"x"', b"", b'{"x": ' + b"[" * 200 + b"]" * 200 + b"}",
    b'{"x": ' + b"[" * 2000 + b"]" * 2000 + b"}", b'{"n": ' + b"9" * 65 + b"}",
]


@pytest.mark.parametrize("raw", EDGES)
def test_edge_bodies_read_the_same_both_ways(raw: bytes) -> None:
    _same(raw)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(), json_values, max_size=5))
def test_any_json_object_reads_the_same_both_ways(body: dict[str, Any]) -> None:
    _same(json.dumps(body).encode())
    _same(json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass"))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_read_the_same_both_ways(raw: bytes) -> None:
    _same(b'{"a": ' + raw + b"}")


@pytest.mark.parametrize("raw", [
    b'{"n": 12345678901234567890}',            # 20 digits: an int beyond 64 bits, exact
    b'{"n": -9223372036854775809}',
    b'{"x": ' + b"[" * 130 + b"]" * 130 + b"}",  # too deep: refused either way
])
def test_the_text_check_never_lets_a_lossy_read_through(raw: bytes) -> None:
    assert not _plain_text(raw)
    assert _outcome(parse_json_object, raw) == _outcome(_parse_with_stdlib, raw)


def test_a_number_that_overflows_is_refused_before_the_text_check() -> None:
    raw = b'{"t": 1e400}'  # no long digit run, but orjson refuses it: the standard path says no
    assert _plain_text(raw)
    assert _outcome(parse_json_object, raw) == _outcome(_parse_with_stdlib, raw)
    assert _outcome(parse_json_object, raw)[0] == "refused"


def test_the_text_check_passes_a_usual_chat_body() -> None:
    raw = (b'{"model": "m", "temperature": 0.7, "max_tokens": 16, "stream": true, '
           b'"messages": [{"role": "user", "content": "hello 12345"}]}')
    assert _plain_text(raw)
    assert parse_json_object(raw) == _parse_with_stdlib(raw)
