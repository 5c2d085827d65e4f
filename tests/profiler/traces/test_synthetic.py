"""Synthetic workloads: exact token counts, determinism, no shared prefixes."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.traces import (
    multi_turn_conversations,
    named_workload,
    two_turn_conversations,
)
from profiler.traces.synthetic import synthetic_names
from proxy.shared.discretize import TURN1_PROFILES, WORKLOAD_SHAPES, ContextClass, Shape
from proxy.shared.tokens import EstimateTokenCounter, HFTokenCounter
from tests.bpe import train_bpe


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_bpe(tmp_path_factory.mktemp("bpe"))


def test_two_turn_exact_token_counts_with_a_real_tokenizer(bpe_dir: Path) -> None:
    tokenizer = HFTokenCounter(bpe_dir)
    turn1 = TURN1_PROFILES[ContextClass.SMALL]
    for shape_name in ("tiny", "mid_paste", "huge_paste"):
        conversations = two_turn_conversations(turn1, shape_name, 3, seed=1, tokenizer=tokenizer)
        shape = WORKLOAD_SHAPES[shape_name]
        for conversation in conversations:
            first, second = conversation.turns
            assert tokenizer.count(first.user) == turn1.n_in
            assert first.n_out_tokens == turn1.n_out
            assert tokenizer.count(second.user) == shape.n_in
            assert second.n_out_tokens == shape.n_out
            assert first.reference_answer is None


def test_approx_tokenizer_counts_are_exact_for_the_estimate() -> None:
    approx = EstimateTokenCounter()
    conversations = two_turn_conversations(Shape(1024, 1024), "big_paste", 2, seed=0)
    for conversation in conversations:
        assert approx.count(conversation.turns[0].user) == 1024
        assert approx.count(conversation.turns[1].user) == 512


def test_seeded_and_distinct_per_conversation() -> None:
    turn1 = TURN1_PROFILES[ContextClass.SMALL]
    a = two_turn_conversations(turn1, "tiny", 20, seed=3)
    b = two_turn_conversations(turn1, "tiny", 20, seed=3)
    c = two_turn_conversations(turn1, "tiny", 20, seed=4)
    assert a == b
    assert a != c
    # different from the first words on, so no two conversations share a cacheable prefix
    openings = {conversation.turns[0].user[:24] for conversation in a}
    assert len(openings) == 20
    assert len({conversation.id for conversation in a}) == 20


def test_multi_turn_shapes_come_from_the_given_set() -> None:
    conversations = multi_turn_conversations(
        Shape(128, 128), ["tiny", "mid_bal"], n_turns=5, count=4, seed=0
    )
    approx = EstimateTokenCounter()
    for conversation in conversations:
        assert len(conversation.turns) == 5
        for turn in conversation.turns[1:]:
            assert (approx.count(turn.user), turn.n_out_tokens) in {(16, 32), (128, 128)}


def test_named_workloads() -> None:
    assert {"small-tiny", "large-huge_paste", "huge-tiny", "mixed", "multi-4", "wildchat"} <= set(
        synthetic_names())
    assert len(synthetic_names()) == 3 * 9 + 3
    pair = named_workload("large-short_gen", 2, seed=0)
    assert [t.n_out_tokens for t in pair[0].turns] == [1024, 256]
    huge = named_workload("huge-tiny", 1, seed=0)[0]
    assert EstimateTokenCounter().count(huge.turns[0].user) == 8192
    assert [t.n_out_tokens for t in huge.turns] == [1024, 32]
    # mixed and multi-N draw turn 1 from the paper's two profiles only, never huge.
    mixed = named_workload("mixed", 10, seed=0)
    assert len(mixed) == 10
    assert {c.turns[0].n_out_tokens for c in mixed} == {128, 1024}
    assert {EstimateTokenCounter().count(c.turns[0].user) for c in mixed} == {128, 1024}
    assert all(len(c.turns) == 3 for c in named_workload("multi-3", 4, seed=0))
    for bad in ("nonsense", "medium-tiny", "small-nope", "multi-x"):
        with pytest.raises(ValueError):
            named_workload(bad, 1, seed=0)
