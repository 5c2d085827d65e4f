"""Decoding vLLM's KV event messages, both event encodings."""

from __future__ import annotations

import msgpack
import pytest

from proxy.live.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventError,
    encode_batch,
    encode_seq,
    parse_message,
    parse_seq,
)

STORED = BlockStored((b"\x01" * 32, b"\x02" * 32), None, 32, 16, "s1")


@pytest.mark.parametrize("positional", [False, True])
def test_both_encodings_decode_to_the_same_events(positional: bool) -> None:
    payload = encode_batch(1.5, [STORED, BlockRemoved((b"\x02" * 32,)), AllBlocksCleared()],
                           positional=positional)
    batch = parse_message([b"kv", encode_seq(7), payload])
    assert batch.seq == 7 and batch.ts == 1.5
    stored, removed, cleared = batch.events
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == STORED.block_hashes and stored.num_tokens == 32
    assert stored.block_size == 16 and stored.parent is None
    # The older positional encoding has no session_id field.
    assert stored.session_id == (None if positional else "s1")
    assert removed == BlockRemoved((b"\x02" * 32,))
    assert cleared == AllBlocksCleared()


def test_a_publisher_with_token_ids_sends_them_and_a_reader_keeps_their_count() -> None:
    # An emulated node knows its blocks' ids and sends them as vLLM does; the proxy reads
    # only how many there are (proxy.live.residency says why).
    stored = BlockStored((-5, 7), 3, 4, 2, "s1", (10, 11, 12, 13))
    raw = msgpack.unpackb(encode_batch(0.0, [stored]), raw=False)
    assert raw[1][0]["token_ids"] == [10, 11, 12, 13]
    assert raw[1][0]["parent_block_hash"] == 3
    event = parse_message([b"kv", encode_seq(0), encode_batch(0.0, [stored])]).events[0]
    assert event == BlockStored((-5, 7), 3, 4, 2, "s1")


def test_vllm_map_encoding_with_extra_fields_and_dp_rank() -> None:
    # As vLLM 0.32 sends it: extra fields, int hashes, data_parallel_rank third.
    event = {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": 10,
             "token_ids": list(range(32)), "block_size": 16, "lora_id": None,
             "medium": "GPU", "lora_name": None, "group_idx": 0, "session_id": "abc"}
    payload = msgpack.packb([2.0, [event, {"type": "SomethingNew"}], 0])
    batch = parse_message([b"", encode_seq(0), payload])
    assert batch.events == (BlockStored((11, 12), 10, 32, 16, "abc"),)


def test_end_marker_is_minus_one() -> None:
    assert parse_seq(END_SEQ) == -1
    assert parse_seq(encode_seq(2**40)) == 2**40


@pytest.mark.parametrize("frames", [
    [b"kv", encode_seq(0)],
    [b"kv", b"\x00", msgpack.packb([0.0, []])],
    [b"kv", encode_seq(0), b"\xc1"],
    [b"kv", encode_seq(0), msgpack.packb({"ts": 1})],
    [b"kv", encode_seq(0), msgpack.packb([0.0, [42]])],
    [b"kv", encode_seq(0), msgpack.packb([0.0, [["BlockStored", [1], None, [], 0]]])],
])
def test_malformed_messages_are_errors(frames: list[bytes]) -> None:
    with pytest.raises(KvEventError):
        parse_message(frames)
