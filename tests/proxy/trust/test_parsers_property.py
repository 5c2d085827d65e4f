"""Issue #45, item 7: every parser of outside input, fed any bytes, gives a value or its own
bounded error - never another exception, and within a time budget (hypothesis' deadline).

The parsers: a discovery heartbeat, a KV event message and batch, a client body, a node's
answer (JSON, SSE stream, readback params, kv_transfer_params stripping), a session record
from Redis. Each is also fed structured near-misses (msgpack/JSON of the right shape with
wrong types and sizes), where a purely random byte string would rarely get past the first
check."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import msgpack
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.live.kv_events import KvEventError, parse_batch, parse_events, read_message
from proxy.readback.protocol import held_kv, without_kv_params
from proxy.sessions.redis_records import RecordError, decode_record
from proxy.shared.completion import ReplyCapture, parse_data
from proxy.shared.errors import BadRequest
from proxy.shared.json_codec import exact_loads, loads
from proxy.shared.validate import Endpoint, parse_json_object, validate_body
from proxy.upstream.discovery import HeartbeatError, parse_heartbeat

FAST = settings(max_examples=150, deadline=200, suppress_health_check=[HealthCheck.too_slow])

# Values of any JSON/msgpack shape, biased to the edges that broke things before.
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.binary(max_size=80), st.sampled_from([2**63, 10**30, -1, 0, "", "\r\n", "\x00"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=12), inner, max_size=6)),
    max_leaves=30)


def packed(value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (OverflowError, TypeError, ValueError):  # an int msgpack cannot hold
        return b"\xc0"


def json_bytes(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return b"{}"


heartbeat_maps = st.fixed_dictionaries(
    {"type": st.sampled_from(["P", "D", "prefill", "decode", "replica", "x", 1])},
    optional={"url": values, "http_address": values, "zmq_address": values,
              "models": values, "token": values})


@FAST
@given(st.one_of(st.binary(max_size=2000), heartbeat_maps.map(packed), values.map(packed)))
def test_a_heartbeat_parses_or_is_a_heartbeat_error(payload: bytes) -> None:
    try:
        beat = parse_heartbeat(payload)
    except HeartbeatError:
        return
    assert beat.url.startswith(("http://", "https://")) and len(beat.url) <= 2048


events = st.one_of(values, st.fixed_dictionaries(
    {"type": st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Other"])},
    optional={"block_hashes": values, "parent_block_hash": values, "token_ids": values,
              "block_size": values, "session_id": values}))
batches = st.tuples(values, st.lists(events, max_size=8)).map(lambda b: packed(list(b)))


@FAST
@given(st.one_of(st.binary(max_size=2000), batches, values.map(packed)),
       st.integers(min_value=0, max_value=2**64 - 1))
def test_a_kv_event_batch_parses_or_is_a_kv_event_error(payload: bytes, seq: int) -> None:
    try:
        batch = parse_batch(seq, payload)
    except KvEventError:
        return
    assert batch.ts == batch.ts and abs(batch.ts) != float("inf")


@FAST
@given(st.lists(st.binary(max_size=64), max_size=5))
def test_a_kv_event_message_parses_or_is_a_kv_event_error(frames: list[bytes]) -> None:
    try:
        raw = read_message(frames)
        parse_events(raw.raw_events)
    except KvEventError:
        return


chat_bodies = st.fixed_dictionaries({}, optional={
    "messages": values, "prompt": values, "stream": values, "max_tokens": values,
    "max_completion_tokens": values, "model": values, "conversation_id": values})


@FAST
@given(st.one_of(st.binary(max_size=2000), chat_bodies.map(json_bytes)),
       st.sampled_from(list(Endpoint)))
def test_a_client_body_parses_or_is_a_bad_request(raw: bytes, endpoint: Endpoint) -> None:
    try:
        validate_body(endpoint, parse_json_object(raw), max_messages=4)
    except BadRequest as exc:
        assert exc.status == 400


@FAST
@given(st.one_of(st.binary(max_size=2000), values.map(json_bytes)))
def test_a_nodes_json_reads_or_is_a_value_error(raw: bytes) -> None:
    for read in (loads, exact_loads):
        with contextlib.suppress(ValueError):
            read(raw)
    assert isinstance(without_kv_params(raw), bytes)
    with contextlib.suppress(ValueError):
        parse_data(raw)


@FAST
@given(st.lists(st.one_of(st.binary(max_size=300), values.map(
    lambda v: b"data: " + json_bytes(v) + b"\n\n")), max_size=10), st.booleans())
def test_a_nodes_stream_is_captured_whatever_it_holds(chunks: list[bytes], stream: bool) -> None:
    capture = ReplyCapture(stream)
    for chunk in chunks:
        capture.feed(chunk)
    captured = capture.finish()
    assert isinstance(captured.text, str)


answers = st.fixed_dictionaries({}, optional={
    "kv_transfer_params": st.one_of(values, st.fixed_dictionaries(
        {"do_remote_decode": st.just(True)},
        optional={k: values for k in ("remote_block_ids", "remote_engine_id", "remote_host",
                                      "remote_port", "remote_request_id",
                                      "remote_num_tokens")})),
    "prompt_token_ids": values, "choices": values})


@FAST
@given(answers)
def test_ds_readback_params_are_kept_only_when_plausible(answer: dict[str, Any]) -> None:
    held = held_kv(answer, "http://10.0.0.1:8200", 0.0, 60.0)
    if held is not None:
        assert held.tokens > 0 and held.params is answer["kv_transfer_params"]


@FAST
@given(values, st.lists(st.one_of(st.text(max_size=20), values), max_size=24))
def test_a_redis_record_decodes_or_is_a_record_error(session_id: Any, flat: list[Any]) -> None:
    try:
        session = decode_record(session_id, flat)
    except RecordError:
        return
    assert 0 <= session.turns <= 2**53 and session.last_access == session.last_access


def test_the_parsers_stay_fast_on_their_largest_inputs() -> None:
    """The budget: each parser on the largest input its bound lets through, well under the
    50 ms a request may spend (measured here, asserted loosely for a loaded machine)."""
    big_heartbeat = packed({"type": "decode", "url": "http://a:1", "models": ["m" * 500] * 64})
    big_batch = packed([1.0, [{"type": "BlockStored", "block_hashes": list(range(4000)),
                               "parent_block_hash": None, "token_ids": [1] * 64_000,
                               "block_size": 16}]])
    started = time.perf_counter()
    parse_heartbeat(big_heartbeat)
    parse_batch(0, big_batch)
    took = time.perf_counter() - started
    assert took < 0.5, took
