from __future__ import annotations

import pytest

from profiler.engine import LinearCost
from profiler.engine.aic import AicCost, load_preset

# Round numbers so every expected time below is computed by hand:
# a step costs 10 ms + 0.1 ms per prompt token + 1 ms per decoding request.
HAND_COST = LinearCost("hand", "tests", base_ms=10.0, per_prefill_token_ms=0.1,
                       per_decode_seq_ms=1.0)


@pytest.fixture
def cost() -> LinearCost:
    return HAND_COST


@pytest.fixture(scope="session")
def h100() -> AicCost:
    """Loading aiconfigurator's data takes ~2 s: once per test session."""
    return load_preset("h100:llama-3.1-8b")
