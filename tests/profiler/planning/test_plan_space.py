"""The layouts `ppd sim plan` searches (`profiler.planning.plan_space`)."""

from __future__ import annotations

import pytest

from profiler.planning.plan_space import (
    hybrids_near,
    p_share,
    plan_space,
    policies_for,
    tp_of,
)
from proxy.shared.vocabulary import Layout


def test_eight_gpus_of_a_tp1_model_give_every_pd_split_and_eight_replicas() -> None:
    space = plan_space(8, "h100:llama-3.1-8b")
    assert (space.instances, space.slices, space.notes) == (8, 1, ())
    assert space.splits == ("1P7D", "2P6D", "3P5D", "4P4D", "5P3D", "6P2D", "7P1D")
    assert space.replica_layout == "8R"


def test_a_tp4_model_on_eight_gpus_has_two_instances() -> None:
    space = plan_space(8, "h100:llama-3.1-70b:tp4")
    assert space.tp == 4 and space.instances == 2
    assert space.splits == ("1P1D",) and space.replica_layout == "2R"
    assert hybrids_near(space, 0.5) == []  # a hybrid needs three instances


def test_a_big_cluster_is_simulated_in_slices_and_its_splits_thinned_with_a_note() -> None:
    space = plan_space(64, "h100:llama-3.1-8b")
    assert (space.slices, space.simulated) == (4, 16)
    assert len(space.splits) == 8
    assert space.splits[0] == "1P15D" and space.splits[-1] == "15P1D"
    assert space.full_name("3P13D") == "12P52D"
    assert any("4 slices of 16" in note for note in space.notes)
    assert any("thinned" in note for note in space.notes)


def test_a_prime_count_leaves_the_remainder_out_and_says_so() -> None:
    space = plan_space(61, "h100:llama-3.1-8b")
    assert (space.slices, space.simulated) == (4, 15)
    assert any("1 instance(s) left out" in note for note in space.notes)


@pytest.mark.parametrize(("gpus", "cost", "message"), [
    (0, "h100:llama-3.1-8b", "between 1 and 64"),
    (65, "h100:llama-3.1-8b", "between 1 and 64"),
    (2, "h100:llama-3.1-70b:tp4", "give at least 4 GPUs"),
])
def test_gpu_counts_that_fit_nothing_are_refused(gpus: int, cost: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_space(gpus, cost)


def test_leftover_gpus_are_named() -> None:
    space = plan_space(6, "h100:llama-3.1-70b:tp4")
    assert space.instances == 1 and "2 GPU(s) left idle" in space.notes[0]


def test_hybrids_keep_the_best_splits_p_share() -> None:
    space = plan_space(8, "h100:llama-3.1-8b")
    hybrids = hybrids_near(space, p_share("2P6D"))
    assert hybrids == ["2P5D1R", "2P4D2R", "1P3D4R"]
    assert all(Layout.parse(name).size == 8 for name in hybrids)


def test_policies_apply_by_layout() -> None:
    asked = ("pd", "local", "live", "ppd")
    assert policies_for("2P6D", asked) == list(asked)
    assert policies_for("8R", asked) == ["replica"]
    assert policies_for("2P4D2R", asked) == ["live"]


def test_tp_is_read_from_the_preset() -> None:
    assert tp_of("h100:llama-3.1-70b:tp4@vllm-0.13") == 4
    assert tp_of("h100:llama-3.1-8b") == 1
