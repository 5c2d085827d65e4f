"""A session record read back from Redis, checked before anything uses it.

The store is shared, so what it holds may have been written by an older or newer proxy, by
hand, or by anyone who reaches it: a non-numeric field, a missing key or a wrong type gave
500s, `/sessions` included. A record that does not hold a session is a `RecordError`; the
store drops it (the turn runs as a new conversation) and counts it
(`ppd_store_records_rejected_total`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from proxy.sessions.session import Held, Session

# A digest is blake2b-16 hex; ids, namespaces and node URLs are short. Anything longer is not
# a record this proxy wrote.
MAX_FIELD_CHARS = 4096
# Integers a record holds (turns, held length and tokens): at most 2^53, where a float still
# counts exactly (the proxy compares and adds them).
MAX_COUNT = 2**53
_INTEGER = re.compile(r"[0-9]{1,16}")


class RecordError(ValueError):
    """A record from the store that is not a session this proxy could have written."""


def decode_record(session_id: Any, flat: Sequence[Any]) -> Session:
    """The session a flat HGETALL reply holds, or RecordError."""
    if not isinstance(session_id, str) or not 0 < len(session_id) <= MAX_FIELD_CHARS:
        raise RecordError("session id missing or not a short string")
    if len(flat) % 2:
        raise RecordError("record with an odd number of fields")
    rec: dict[str, str] = {}
    for key, value in zip(flat[::2], flat[1::2], strict=True):
        if not isinstance(key, str) or not isinstance(value, str) \
                or len(value) > MAX_FIELD_CHARS:
            raise RecordError(f"field {key!r:.40} is not a short string")
        rec[key] = value
    rec.pop("id", None)  # an index entry names its session
    held = None
    if rec.get("hd"):
        held = Held(_count(rec, "hl"), rec["hd"], _count(rec, "ht"))
    return Session(session_id, rec.get("opening", ""), rec.get("hashed") == "1",
                   rec.get("decode") or None, rec.get("prefill") or None,
                   _count(rec, "turns", "0"), _time(rec, "last_access"), held,
                   _time(rec, "created"))


def _count(rec: dict[str, str], key: str, default: str | None = None) -> int:
    text = rec.get(key, default)
    if text is None or not _INTEGER.fullmatch(text) or int(text) > MAX_COUNT:
        raise RecordError(f"field {key!r} is {text!r:.40}, not a count")
    return int(text)


def _time(rec: dict[str, str], key: str) -> float:
    text = rec.get(key, "0")
    try:
        value = float(text)
    except ValueError:
        raise RecordError(f"field {key!r} is {text!r:.40}, not a time") from None
    if not math.isfinite(value) or value < 0:
        raise RecordError(f"field {key!r} is {text!r:.40}, not a time")
    return value
