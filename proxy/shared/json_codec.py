"""JSON on the hot path: orjson where it can, the standard library where orjson refuses.

The proxy decodes every SSE event it relays (the reply capture) and encodes every leg's body;
with the standard library that was a third of its CPU per request (benchmarks/proxy_overhead).
orjson refuses what Python's json allows - NaN/Infinity in a payload, integers beyond 64 bits
in a body to encode (the request validation lets any int of up to 64 digits through) - so
those fall back to the standard library and read or write as before.

`loads` is for reading what the proxy does not pass on: orjson reads an integer beyond 64
bits as a float. What goes on to a node (P's kv_transfer_params) is read by `exact_loads`:
orjson when the text holds no number that could be that large, else `json` itself.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(data: str | bytes) -> Any:
    """Decode one JSON document (ValueError when it is not one); integers beyond 64 bits come
    back as floats."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # Lenient, as Python reads (a NaN logprob is no malformed event): whoever uses a
        # number read here checks it is finite and in range (`proxy.shared.tokens`).
        return json.loads(data)


# What goes on to another node is read as JSON proper: NaN and Infinity are not JSON, a number
# that overflows a double (1e309) is no count, and an integer of more than MAX_INT_DIGITS
# digits is no block id or port (vLLM would refuse them after the P leg ran).
MAX_INT_DIGITS = 64


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf or NaN
        raise ValueError(f"number {text[:32]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS and len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _strict_loads(data: str | bytes) -> Any:
    """`json.loads` refusing NaN, Infinity, overflowing floats and 64+-digit integers."""
    return json.loads(data, parse_constant=_refuse_constant, parse_float=_finite_float,
                      parse_int=_bounded_int)


# orjson and json read every number to the same value except integers beyond 64 bits (orjson:
# a float), and those take 19 digits or more in a row; numbers that overflow a double orjson
# refuses outright. So a text without such a run reads the same both ways.
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_DIGIT_RUN = b"0" * 19


def may_hold_huge_integer(data: bytes) -> bool:
    """Whether the text has 19 or more digits in a row (at C speed: a regular expression for
    it took 30-75 us on a 4 KB body, this ~2 us)."""
    return _LONG_DIGIT_RUN in data.translate(_DIGITS_AS_ZERO)


def exact_loads(data: bytes) -> Any:
    """Decode one JSON document exactly as `json.loads` does (ValueError when it is not one),
    with orjson whenever the text allows (the standard library was 2% of the proxy's CPU per
    P->D request, reading P's answer)."""
    if not may_hold_huge_integer(data):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # what orjson refuses (a lone surrogate) json may read
    return _strict_loads(data)


def dumps(value: Any) -> bytes:
    """Encode a JSON-ready value as compact UTF-8 bytes."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: an int beyond 64 bits, a non-str key
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
