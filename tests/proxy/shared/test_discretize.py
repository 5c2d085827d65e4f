"""The shared discretization: context classes, the nine shapes, nearest qps."""

from __future__ import annotations

import pytest

from proxy.shared.discretize import (
    PAPER_CONTEXTS,
    TURN1_PROFILES,
    WORKLOAD_SHAPES,
    Cell,
    ContextClass,
    classify,
    context_class,
    nearest_qps,
    workload_shape,
)


@pytest.mark.parametrize(("n_ctx", "expected"), [
    (0, ContextClass.SMALL), (512, ContextClass.SMALL), (513, ContextClass.LARGE),
    (4096, ContextClass.LARGE), (4097, ContextClass.HUGE),
])
def test_context_class_boundaries(n_ctx: int, expected: ContextClass) -> None:
    assert context_class(n_ctx) is expected


def test_every_class_has_a_turn1_profile_that_lands_in_it() -> None:
    # The context D holds before turn 2 is turn 1's prompt plus its output.
    assert set(TURN1_PROFILES) == set(ContextClass)
    for context, shape in TURN1_PROFILES.items():
        assert context_class(shape.n_in + shape.n_out) is context
    assert PAPER_CONTEXTS == (ContextClass.SMALL, ContextClass.LARGE)


def test_each_shape_maps_to_itself() -> None:
    for name, shape in WORKLOAD_SHAPES.items():
        assert workload_shape(shape.n_in, shape.n_out) == name


@pytest.mark.parametrize(("n_in", "n_out", "expected"), [
    (20, 40, "tiny"), (2000, 16, "huge_paste"), (40, 300, "short_gen"), (0, 0, "tiny"),
    (100, 110, "mid_bal"), (48, 2000, "very_long_gen"),
])
def test_nearest_shape_in_log_space(n_in: int, n_out: int, expected: str) -> None:
    assert workload_shape(n_in, n_out) == expected


def test_nearest_qps_and_classify() -> None:
    assert nearest_qps(1.4, [2.0, 1.0]) == 1.0
    assert nearest_qps(1.5, [2.0, 1.0]) == 1.0  # tie: the lower load
    with pytest.raises(ValueError):
        nearest_qps(1.0, [])
    assert classify(1000, 500, 70, 3.9, [1, 4]) == Cell(ContextClass.LARGE, "big_paste", 4)
