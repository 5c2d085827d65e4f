"""vLLM's KV cache events, decoded from the wire (pure: bytes in, events out).

vLLM (`vllm/distributed/kv_events.py`, `ZmqEventPublisher`) publishes on a ZMQ PUB socket,
one multipart message per batch: `[topic, seq, payload]`, where seq is an 8-byte big-endian
unsigned counter starting at 0 and payload is msgpack of `KVEventBatch`, an array
`[ts, events]` or `[ts, events, data_parallel_rank]` (msgspec `array_like`, trailing defaults
omitted). An event is one of three tagged structs, in one of two encodings:

- vLLM >= 0.11 (map): `{"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h,
  "token_ids": [...], "block_size": n, ..., "session_id": s}`, `{"type": "BlockRemoved",
  "block_hashes": [...], ...}`, `{"type": "AllBlocksCleared"}`;
- older (positional arrays, tag first): `["BlockStored", hashes, parent, token_ids,
  block_size, lora_id, medium]`, `["BlockRemoved", hashes, medium]`, `["AllBlocksCleared"]`.

A block hash is bytes (vLLM's own digest) or an int (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`);
either is kept as is, as an opaque key. The optional replay socket (ROUTER) answers a request
`[b"", start_seq]` with `[b"", topic, seq, payload]` per buffered batch from start_seq on,
then `[b"", b"", END_SEQ, b""]` (END_SEQ = -1 as 8 signed big-endian bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgpack

BlockHash = bytes | int
# vLLM's block hashes are 32-byte digests (sha256, or a 64-bit int); a session id is what the
# proxy sent (validate.MAX_SESSION_ID_CHARS). A forged event with 1 MB hashes or ids once
# added 435 MB to an index that counted blocks, not bytes.
MAX_HASH_BYTES = 64
MAX_SESSION_ID_CHARS = 256
END_SEQ = (-1).to_bytes(8, "big", signed=True)
_SEQ_BYTES = 8


class KvEventError(ValueError):
    """A message that is not a vLLM KV event batch."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks a node now holds, chained after parent (None: the first block)."""

    block_hashes: tuple[BlockHash, ...]
    parent: BlockHash | None
    num_tokens: int  # tokens in these blocks (len(token_ids))
    block_size: int
    session_id: str | None = None  # vLLM >= 0.32: the request's `session_id` field
    # The blocks' token ids, for a publisher that has them (an emulated node); a decoded event
    # keeps only their number: residency never reads the ids (proxy.live.residency says why).
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks a node evicted."""

    block_hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The node dropped its whole prefix cache (reset, restart)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One published message: its sequence number, timestamp and events."""

    seq: int
    ts: float
    events: tuple[KvEvent, ...]


def parse_seq(frame: bytes) -> int:
    """The 8-byte big-endian sequence number of a message (-1 for the replay's end marker)."""
    if len(frame) != _SEQ_BYTES:
        raise KvEventError(f"sequence frame of {len(frame)} bytes, expected {_SEQ_BYTES}")
    return int.from_bytes(frame, "big", signed=frame == END_SEQ)


@dataclass(frozen=True, slots=True)
class RawBatch:
    """A published message unpacked but its events not yet decoded: the subscriber decodes
    and applies them a slice at a time, so a huge batch never blocks the loop at once."""

    seq: int
    ts: float
    raw_events: list[Any]


def parse_message(frames: list[bytes]) -> EventBatch:
    """Decode a published `[topic, seq, payload]` message."""
    raw = read_message(frames)
    return EventBatch(raw.seq, raw.ts, parse_events(raw.raw_events))


def read_message(frames: list[bytes]) -> RawBatch:
    """Unpack a published `[topic, seq, payload]` message, its events still undecoded."""
    if len(frames) != 3:
        raise KvEventError(f"expected [topic, seq, payload], got {len(frames)} frames")
    return read_batch(parse_seq(frames[1]), frames[2])


def parse_batch(seq: int, payload: bytes) -> EventBatch:
    """Decode one msgpack `KVEventBatch` payload."""
    raw = read_batch(seq, payload)
    return EventBatch(seq, raw.ts, parse_events(raw.raw_events))


def read_batch(seq: int, payload: bytes) -> RawBatch:
    """Unpack one msgpack `KVEventBatch` payload (its events decoded by `parse_events`)."""
    try:
        data: Any = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated exception types
        raise KvEventError(f"payload is not msgpack: {exc}") from exc
    if not isinstance(data, (list, tuple)) or len(data) < 2 or not isinstance(data[1], list):
        raise KvEventError("payload is not a [ts, events, ...] batch")
    ts = float(data[0]) if isinstance(data[0], (int, float)) else 0.0
    if not math.isfinite(ts):
        raise KvEventError(f"batch timestamp {ts}")
    return RawBatch(seq, ts, data[1])


def parse_events(raw_events: list[Any]) -> tuple[KvEvent, ...]:
    """Decode unpacked events (unknown kinds skipped; KvEventError for a malformed one)."""
    return tuple(event for raw in raw_events if (event := parse_event(raw)) is not None)


def parse_event(raw: Any) -> KvEvent | None:
    """One event in either encoding; None for a tag this reader does not know (skipped, so
    a newer vLLM's extra event kinds do not stop the stream)."""
    if isinstance(raw, dict):
        return _from_map(raw)
    if isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        return _from_array(raw)
    raise KvEventError(f"event is neither a tagged map nor a tagged array: {raw!r:.80}")


def _from_map(raw: dict[str, Any]) -> KvEvent | None:
    kind = raw.get("type")
    if kind == "BlockStored":
        return _stored(raw.get("block_hashes"), raw.get("parent_block_hash"),
                       raw.get("token_ids"), raw.get("block_size"), raw.get("session_id"))
    if kind == "BlockRemoved":
        return BlockRemoved(_hashes(raw.get("block_hashes")))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _from_array(raw: list[Any] | tuple[Any, ...]) -> KvEvent | None:
    kind, fields = raw[0], raw[1:]
    if kind == "BlockStored":
        if len(fields) < 4:
            raise KvEventError("positional BlockStored with fewer than 4 fields")
        return _stored(fields[0], fields[1], fields[2], fields[3], None)
    if kind == "BlockRemoved":
        if not fields:
            raise KvEventError("positional BlockRemoved without block hashes")
        return BlockRemoved(_hashes(fields[0]))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _stored(hashes: Any, parent: Any, token_ids: Any, block_size: Any,
            session_id: Any) -> BlockStored:
    if not isinstance(block_size, int) or block_size <= 0:
        raise KvEventError(f"BlockStored with block_size {block_size!r}")
    if parent is not None and not _is_hash(parent):
        raise KvEventError(f"BlockStored with parent hash {parent!r:.40}")
    stored = _hashes(hashes)
    if isinstance(session_id, str) and len(session_id) > MAX_SESSION_ID_CHARS:
        raise KvEventError(f"BlockStored with a session id of {len(session_id)} characters "
                           f"(at most {MAX_SESSION_ID_CHARS})")
    num_tokens = len(token_ids) if isinstance(token_ids, list) else len(stored) * block_size
    return BlockStored(stored, parent, num_tokens, block_size,
                       session_id if isinstance(session_id, str) else None)


def _is_hash(value: Any) -> bool:
    """A block hash: bytes of at most MAX_HASH_BYTES, or an int (msgpack's are 64-bit)."""
    return (isinstance(value, bytes) and len(value) <= MAX_HASH_BYTES) or (
        isinstance(value, int) and not isinstance(value, bool))


def _hashes(raw: Any) -> tuple[BlockHash, ...]:
    if not isinstance(raw, list) or not all(_is_hash(h) for h in raw):
        raise KvEventError(f"block_hashes is not a list of ints or bytes of at most "
                           f"{MAX_HASH_BYTES}")
    return tuple(raw)


# -- encoding: what a publisher sends (the emulated nodes, the tests' fake publisher) -------

def encode_event(event: KvEvent, *, positional: bool = False) -> Any:
    """An event as vLLM encodes it: a tagged map (current) or a tagged array (older)."""
    if isinstance(event, BlockStored):
        tokens = (list(event.token_ids) if event.token_ids is not None
                  else [0] * event.num_tokens)  # a decoded event kept only the count
        if positional:
            return ["BlockStored", list(event.block_hashes), event.parent, tokens,
                    event.block_size, None, "GPU"]
        return {"type": "BlockStored", "block_hashes": list(event.block_hashes),
                "parent_block_hash": event.parent, "token_ids": tokens,
                "block_size": event.block_size, "lora_id": None, "medium": "GPU",
                "lora_name": None, "session_id": event.session_id}
    if isinstance(event, BlockRemoved):
        if positional:
            return ["BlockRemoved", list(event.block_hashes), "GPU"]
        return {"type": "BlockRemoved", "block_hashes": list(event.block_hashes),
                "medium": "GPU"}
    return ["AllBlocksCleared"] if positional else {"type": "AllBlocksCleared"}


def encode_batch(ts: float, events: list[KvEvent], *, positional: bool = False) -> bytes:
    """A `KVEventBatch` payload (data_parallel_rank omitted, as vLLM omits the default)."""
    return msgpack.packb([ts, [encode_event(e, positional=positional) for e in events]],
                         use_bin_type=True)


def encode_seq(seq: int) -> bytes:
    return seq.to_bytes(_SEQ_BYTES, "big")
