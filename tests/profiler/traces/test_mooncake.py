"""Timed block-hash traces: record checks, the conversation rule, the window."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.traces import TraceFormat, load_trace
from profiler.traces.formats import detect_format
from profiler.traces.loader import trace_format
from profiler.traces.mooncake import (
    BLOCK_TOKENS,
    TraceWindow,
    load_timed_trace,
    parents,
    parse_records,
    timed_requests,
)
from profiler.traces.records import TraceFileError

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "datasets" / "samples" / "mooncake_sample.jsonl"
FULL = REPO.parent / "shared" / "traces" / "mooncake-conversation.jsonl"


def rec(t_ms: float, hashes: list[int], *, partial: int = 100, out: int = 50) -> dict:
    """A record whose last block holds `partial` tokens (BLOCK_TOKENS: all complete)."""
    return {"timestamp": t_ms, "input_length": (len(hashes) - 1) * BLOCK_TOKENS + partial,
            "output_length": out, "hash_ids": hashes}


def links(*records: dict) -> list[int | None]:
    return parents(parse_records(records))


def test_a_continuation_extends_the_complete_blocks_of_an_earlier_request() -> None:
    # request 0: blocks 0,1,2 complete + partial 3; request 1 keeps 0,1,2 and goes on
    assert links(rec(0, [0, 1, 2, 3]), rec(10, [0, 1, 2, 4, 5])) == [None, 0]


def test_the_partial_last_block_is_not_evidence() -> None:
    # request 1 shares request 0's partial block 3 too: still its child (longest complete)
    assert links(rec(0, [0, 1, 2, 3]), rec(10, [0, 1, 2, 3, 6])) == [None, 0]
    # a request whose complete blocks are not all a prefix is no parent
    assert links(rec(0, [0, 1, 2, 3], partial=BLOCK_TOKENS), rec(10, [0, 1, 2, 9])) == [None,
                                                                                           None]


def test_forks_then_the_longest_then_the_latest_parent() -> None:
    full = BLOCK_TOKENS
    records = [rec(0, [0, 1, 2], partial=full),  # complete: 0 1 2
               rec(1, [0, 1, 2, 3, 4]),  # complete: 0 1 2 3 -> continues 0
               rec(2, [0, 1, 2, 5, 6]),  # a fork: continues 0 too (1's block 3 differs)
               rec(3, [0, 1, 2, 3, 9]),  # 1 (4 blocks) beats 0 (3 blocks)
               rec(4, [0, 1, 2, 3, 8])]  # 1 and 3 both have 0 1 2 3: the latest, 3
    assert links(*records) == [None, 0, 0, 1, 3]


def test_a_shared_system_block_alone_is_no_continuation() -> None:
    # every request starts with block 0; a short one (block 0 complete only) parents nobody
    records = [rec(0, [0, 1]), rec(1, [0], partial=BLOCK_TOKENS), rec(2, [0, 2, 3])]
    assert links(*records) == [None, None, None]


def test_an_identical_request_is_not_its_own_continuation() -> None:
    same = rec(0, [0, 1, 2], partial=BLOCK_TOKENS)
    assert links(same, {**same, "timestamp": 5}) == [None, None]


def test_turns_history_and_conversations() -> None:
    requests = timed_requests(parse_records([
        rec(0, [0, 1, 2], out=40), rec(1000, [0, 5, 6]), rec(2000, [0, 1, 2, 3, 4], out=7),
        rec(3000, [0, 1, 2, 3, 4, 8, 9])]))
    assert [(r.conversation, r.turn) for r in requests] == [
        ("mooncake-0", 1), ("mooncake-1", 1), ("mooncake-0", 2), ("mooncake-0", 3)]
    first, third = requests[0].record, requests[2]
    # the reply counts as history: parent's prompt + its 40 output tokens
    assert third.history_tokens == first.input_length + 40
    assert third.new_tokens == third.record.input_length - third.history_tokens
    assert requests[0].history_tokens == 0 and requests[0].new_tokens == first.input_length


def test_window_cuts_scales_and_restarts_conversations() -> None:
    records = parse_records([rec(0, [0, 1, 2]), rec(10_000, [0, 1, 2, 3]),
                             rec(20_000, [0, 1, 2, 3, 4]), rec(30_000, [0, 7, 8])])
    window = TraceWindow(start_s=5, duration_s=20, time_scale=2)
    requests = timed_requests(records, window)
    assert [r.record.index for r in requests] == [1, 2]
    assert [r.arrival_s for r in requests] == [2.5, 7.5]  # (10 - 5) / 2, (20 - 5) / 2
    # request 1's parent (0) is before the window: it starts its own conversation there
    assert (requests[0].conversation, requests[0].turn, requests[0].parent) == (
        "mooncake-1", 1, None)
    assert (requests[1].conversation, requests[1].turn) == ("mooncake-1", 2)


@pytest.mark.parametrize("record, message", [
    ({"timestamp": 0, "input_length": 600, "output_length": 1}, "missing ['hash_ids']"),
    ({"timestamp": -1, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]},
     "'timestamp' must be"),
    ({"timestamp": 0, "input_length": "600", "output_length": 1, "hash_ids": [0, 1]},
     "'input_length' must be an integer"),
    ({"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]},
     "1 hash_ids for input_length 600"),
    ({"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0, "x"]},
     "'hash_ids' must be a non-empty list of integers"),
])
def test_malformed_records_are_named(tmp_path: Path, record: dict, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(rec(0, [0, 1])) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(TraceFileError, match="record 2") as caught:
        load_timed_trace(path)
    assert message in str(caught.value)


def test_timestamps_must_not_go_back(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(rec(5, [0, 1])) + "\n" + json.dumps(rec(1, [0, 2])) + "\n")
    with pytest.raises(TraceFileError, match="arrival order"):
        load_timed_trace(path)


def test_an_empty_window_says_what_the_trace_spans() -> None:
    with pytest.raises(TraceFileError, match="no request in the window"):
        load_timed_trace(SAMPLE, TraceWindow(start_s=10_000))


def test_format_is_detected_and_text_loading_refuses_it() -> None:
    first = json.loads(SAMPLE.read_text().splitlines()[0])
    assert detect_format(first) is TraceFormat.MOONCAKE
    assert trace_format(SAMPLE) is TraceFormat.MOONCAKE
    with pytest.raises(TraceFileError, match="timed block-hash trace"):
        load_trace(SAMPLE)
    with pytest.raises(TraceFileError, match="not a sharegpt file"):
        trace_format(SAMPLE, TraceFormat.SHAREGPT)


def test_the_sample_or_full_trace_has_multi_turn_conversations() -> None:
    """On the full trace (when ../shared has it) the rule finds ~4,000 continuations, the
    README's number; on the shipped sample, some."""
    path = FULL if FULL.is_file() else SAMPLE
    requests = load_timed_trace(path)
    continued = sum(r.turn > 1 for r in requests)
    if path == FULL:
        assert len(requests) == 12_031 and 3_900 <= continued <= 4_100
        assert max(r.turn for r in requests) >= 12
    else:
        assert continued >= 50
    # a continuation shares at least two complete blocks with the request it continues
    by_index = {r.record.index: r.record for r in requests}
    for request in requests:
        if request.parent is not None:
            parent = by_index[request.parent]
            n = parent.complete_blocks
            assert n >= 2 and request.record.hash_ids[:n] == parent.hash_ids[:n]
