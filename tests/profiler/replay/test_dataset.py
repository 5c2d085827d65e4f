"""A replay's dataset from a typed spec: synthetic names, trace files, filters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.replay.dataset import DatasetSpec, load_dataset
from profiler.traces import TraceFilter
from proxy.shared.tokens import EstimateTokenCounter


def test_a_synthetic_spec_is_generated_with_its_seed() -> None:
    counter = EstimateTokenCounter()
    one = load_dataset(DatasetSpec("synthetic:small-tiny", seed=3), counter, 4)
    assert len(one) == 4 and one == load_dataset(DatasetSpec("synthetic:small-tiny", seed=3),
                                                 counter, 4)
    assert one != load_dataset(DatasetSpec("synthetic:small-tiny", seed=4), counter, 4)


def test_a_trace_file_is_filtered_and_an_empty_result_says_why(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps([{"id": "a", "conversations": [
        {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]))
    [conversation] = load_dataset(DatasetSpec(str(path)), EstimateTokenCounter(), 10)
    assert conversation.turns[0].user == "hi"
    with pytest.raises(ValueError, match="passes the filters"):
        load_dataset(DatasetSpec(str(path), filters=TraceFilter(min_turns=2)),
                     EstimateTokenCounter(), 10)
