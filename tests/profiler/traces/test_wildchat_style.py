"""WildChat-style shapes: the fitted families reproduce the published statistics, a large
sample lands near them, and everything is fixed by the seed."""

from __future__ import annotations

import math
import statistics

import pytest

from profiler.traces import named_workload
from profiler.traces.wildchat_style import (
    ASSISTANT_TOKENS,
    ASSISTANT_TOKENS_MEAN,
    ASSISTANT_TOKENS_SD,
    MAX_CONTEXT_TOKENS,
    MEAN_TURNS,
    SHARE_OVER_10_TURNS,
    TURNS,
    USER_TOKENS,
    USER_TOKENS_MEAN,
    USER_TOKENS_SD,
    conversation_shapes,
)
from proxy.shared.tokens import EstimateTokenCounter

SAMPLE = 20_000  # conversations, ~50,000 turns: 0.2 s to draw


@pytest.fixture(scope="module")
def sample() -> list[tuple]:
    return conversation_shapes(SAMPLE, seed=0)


def test_fitted_families_have_the_published_moments() -> None:
    assert round(MEAN_TURNS, 3) == 2.538  # 2,639,415 turns / 1,039,785
    assert USER_TOKENS.mean == pytest.approx(USER_TOKENS_MEAN, rel=1e-9)
    assert USER_TOKENS.sd == pytest.approx(USER_TOKENS_SD, rel=1e-9)
    assert ASSISTANT_TOKENS.mean == pytest.approx(ASSISTANT_TOKENS_MEAN, rel=1e-9)
    assert ASSISTANT_TOKENS.sd == pytest.approx(ASSISTANT_TOKENS_SD, rel=1e-9)
    mean = sum(n * TURNS.pmf(n) for n in range(1, 2_000))
    assert mean == pytest.approx(MEAN_TURNS, rel=1e-6)
    assert TURNS.share_over(10) == pytest.approx(SHARE_OVER_10_TURNS, rel=1e-6)
    # what the families imply, as the docs quote it
    assert math.exp(USER_TOKENS.mu) == pytest.approx(53.4, abs=0.1)
    assert TURNS.pmf(1) == pytest.approx(0.62, abs=0.005)


def test_a_large_sample_lands_near_the_published_statistics(sample: list[tuple]) -> None:
    turns = [len(shapes) for shapes in sample]
    users = [shape.n_in for shapes in sample for shape in shapes]
    replies = [shape.n_out for shapes in sample for shape in shapes]
    assert statistics.fmean(turns) == pytest.approx(MEAN_TURNS, rel=0.03)
    assert sum(n > 10 for n in turns) / SAMPLE == pytest.approx(SHARE_OVER_10_TURNS, abs=0.004)
    assert statistics.fmean(replies) == pytest.approx(ASSISTANT_TOKENS_MEAN, rel=0.03)
    assert statistics.pstdev(replies) == pytest.approx(ASSISTANT_TOKENS_SD, rel=0.05)
    # A prompt's sample sd converges too slowly to test (its kurtosis is ~1e6), so the heavy
    # tail is checked where it is estimable: the mean, and the lognormal's median and log-sd.
    assert statistics.fmean(users) == pytest.approx(USER_TOKENS_MEAN, rel=0.08)
    assert statistics.median(users) == pytest.approx(math.exp(USER_TOKENS.mu), rel=0.05)
    log_sd = statistics.pstdev([math.log(n) for n in users])
    assert log_sd == pytest.approx(USER_TOKENS.sigma, rel=0.03)
    assert statistics.pstdev(users) > 3 * statistics.fmean(users)
    long_pastes = sum(n > 1024 for n in users) / len(users)
    assert long_pastes == pytest.approx(0.055, abs=0.005)


def test_every_conversation_fits_the_context_window(sample: list[tuple]) -> None:
    assert all(shapes for shapes in sample)
    assert max(sum(s.n_in + s.n_out for s in shapes) for shapes in sample) <= MAX_CONTEXT_TOKENS


def test_seeded_and_deterministic() -> None:
    assert conversation_shapes(300, seed=3) == conversation_shapes(300, seed=3)
    assert conversation_shapes(300, seed=3) != conversation_shapes(300, seed=4)
    # the first k of n are the k asked for alone (the simulator caches one batch per seed)
    assert conversation_shapes(500, seed=3)[:300] == conversation_shapes(300, seed=3)


def test_named_workload_renders_the_shapes_exactly() -> None:
    tokenizer = EstimateTokenCounter()
    conversations = named_workload("wildchat", 40, seed=1)
    assert conversations == named_workload("wildchat", 40, seed=1)
    for conversation, shapes in zip(conversations, conversation_shapes(40, seed=1),
                                    strict=True):
        assert [(tokenizer.count(t.user), t.n_out_tokens) for t in conversation.turns] == [
            (s.n_in, s.n_out) for s in shapes]
    assert len({c.id for c in conversations}) == 40
    assert len({c.turns[0].user[:24] for c in conversations}) == 40
