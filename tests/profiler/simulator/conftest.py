from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.engine import LinearCost

# Round numbers so expected times are computed by hand: a step costs 10 ms + 0.1 ms per
# prompt token + 1 ms per decoding request (the engine tests' HAND_COST).
HAND = {"kind": "linear", "name": "hand", "source": "tests", "base_ms": 10.0,
        "per_prefill_token_ms": 0.1, "per_decode_seq_ms": 1.0}


@pytest.fixture
def hand_cost() -> LinearCost:
    return LinearCost.from_dict(HAND)


@pytest.fixture
def hand_preset(tmp_path: Path) -> str:
    """The hand cost as a preset file, for specs and commands (they take a preset name)."""
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(HAND))
    return str(path)
