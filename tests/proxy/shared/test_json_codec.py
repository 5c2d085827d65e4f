"""The hot path's JSON: orjson's output where it can, the standard library's where it cannot."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.shared.json_codec import dumps, exact_loads, loads, may_hold_huge_integer


def test_dumps_is_compact_utf8_json_that_reads_back() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo \u2028 \"q\""}],
            "max_tokens": 7, "temperature": 0.5, "stream": True, "stop": None}
    encoded = dumps(body)
    assert json.loads(encoded) == body
    assert b" " not in encoded.replace(b"h\xc3\xa9llo \xe2\x80\xa8 ", b"")


def test_integers_beyond_64_bits_are_written_exactly() -> None:
    # The request validation lets up to 64 digits through; orjson stops at 64 bits.
    assert dumps({"max_tokens": 10**30}) == b'{"max_tokens":1' + b"0" * 30 + b"}"
    assert dumps({"n": -(2**63) - 1}) == b'{"n":-9223372036854775809}'


@pytest.mark.parametrize("text", [b"[NaN]", b"[Infinity]", b"[-Infinity]", b"[1e309]",
                                  b"[-1e309]", b'{"a": NaN, "b": "\\ud800"}'])
def test_what_is_no_json_number_is_refused_where_it_goes_on_to_a_node(text: bytes) -> None:
    """Issue #45: P's answer, read to pass its kv_transfer_params on to D, is JSON proper."""
    with pytest.raises(ValueError):
        exact_loads(text)


def test_nan_and_infinity_are_read_as_python_reads_them() -> None:
    value = loads(b'[NaN, Infinity, -Infinity]')
    assert math.isnan(value[0]) and value[1:] == [math.inf, -math.inf]


def test_an_integer_of_over_64_digits_is_refused_where_read_exactly() -> None:
    with pytest.raises(ValueError):
        exact_loads(b"[" + b"9" * 65 + b"]")
    assert isinstance(loads(b"[" + b"9" * 65 + b"]")[0], float)  # loads: a float, as before


def test_a_64_digit_integer_is_still_read_exactly() -> None:
    assert exact_loads(b"[" + b"9" * 64 + b"]") == [int("9" * 64)]


@pytest.mark.parametrize("text", [b"{not json", b"", b'{"a": 1'])
def test_not_json_raises_value_error(text: bytes) -> None:
    with pytest.raises(ValueError):
        loads(text)


@pytest.mark.parametrize("text", [
    b'{"remote_block_ids": [1, 2, 3], "remote_host": "10.0.0.1", "remote_port": 5600}',
    b'{"id": 123456789012345678901234567890}',   # beyond 64 bits: stays an exact int
    b'{"x": 1.5e300, "y": -0.0, "z": 0.1}',
    b'{"s": "\\ud800"}',                         # a lone surrogate: json reads it
    b'[1, 2',                                     # not JSON either way
])
def test_exact_loads_reads_what_json_reads(text: bytes) -> None:
    def outcome(read: Any) -> Any:
        try:
            return repr(read(text))
        except ValueError as exc:
            return type(exc).__mro__[-3]  # ValueError, whichever subclass
    assert outcome(exact_loads) == outcome(json.loads)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=-(2**80), max_value=2**80), st.text(max_size=20))
def test_every_integer_orjson_would_read_as_a_float_is_flagged(n: int, text: str) -> None:
    document = json.dumps({"text": text, "n": n}).encode()
    if isinstance(orjson.loads(document)["n"], float):
        assert may_hold_huge_integer(document)
    assert exact_loads(document) == json.loads(document)
