"""The Responses overhead benchmark runs its rows and renders its comparison."""

from __future__ import annotations

from benchmarks import responses_overhead


def test_every_row_is_measured_and_compared() -> None:
    rows = responses_overhead.run(3)
    labels = [label for label, _ in rows]
    assert labels == [f"{what}, {how}" for how in ("whole", "streamed") for what in (
        "direct to the fake D", "chat completions turn 2 (local)", "Responses turn 2 (local)")]
    assert all(len(samples) == 3 and (samples > 0).all() for _, samples in rows)
    table = responses_overhead.render(rows)
    assert "whole: Responses adds" in table and "streamed: Responses adds" in table
