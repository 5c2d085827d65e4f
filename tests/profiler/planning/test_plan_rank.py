"""`ppd sim plan`'s ranking, recommendation and warnings (`profiler.planning.plan_rank`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from profiler.planning.plan_rank import rank, recommendation, table_text, warnings


def _row(layout: str, policy: str, seed: int, slo: float, p90: float = 50.0,
         conversations: int = 150) -> dict[str, Any]:
    return {"layout": layout, "policy": policy, "seed": seed, "slo_attainment": slo,
            "goodput_turns_s": 10 * slo, "turn2plus_ttft_ms_p50": p90 / 2,
            "turn2plus_ttft_ms_p90": p90, "tpot_ms_p50": 7.0, "tpot_ms_p90": 8.0,
            "n_conversations": conversations, "success_rate": 1.0}


def _rows() -> pd.DataFrame:
    return pd.DataFrame([
        _row("2P6D", "live", 0, 0.95), _row("2P6D", "live", 1, 0.97),
        _row("1P7D", "pd", 0, 0.90), _row("1P7D", "pd", 1, 0.92),
        _row("3P5D", "pd", 0, 0.99),  # screened on one seed only
    ])


def test_confirmed_candidates_rank_first_by_attainment() -> None:
    ranked = rank(_rows())
    assert list(zip(ranked["layout"], ranked["policy"], strict=True)) == [
        ("2P6D", "live"), ("1P7D", "pd"), ("3P5D", "pd")]
    assert ranked.loc[0, "slo_attainment"] == 0.96
    assert (ranked.loc[0, "slo_min"], ranked.loc[0, "slo_max"]) == (0.95, 0.97)
    assert list(ranked["seeds"]) == [2, 2, 1]


def test_equal_attainment_goes_to_the_lower_turn2_ttft_p90() -> None:
    rows = pd.DataFrame([_row("2P6D", "pd", 0, 1.0, p90=80), _row("2P6D", "local", 0, 1.0,
                                                                  p90=30)])
    assert rank(rows)["policy"].tolist() == ["local", "pd"]


def test_the_recommendation_gives_the_margin_over_the_runner_up() -> None:
    line = recommendation(rank(_rows()))
    assert line.startswith("recommendation: 2P6D with policy live: SLO attainment 96.0%")
    assert "over the runner-up 1P7D pd: +5.0 points attainment" in line


def test_apart_ranges_give_no_warning_and_overlapping_ones_do() -> None:
    assert warnings(rank(_rows()), _rows()) == []
    close = pd.DataFrame([_row("2P6D", "live", 0, 0.95), _row("2P6D", "live", 1, 0.97),
                          _row("1P7D", "pd", 0, 0.96), _row("1P7D", "pd", 1, 0.94)])
    said = warnings(rank(close), close)
    assert len(said) == 1 and said[0].startswith("too close to call")
    assert "95.0-97.0% vs 94.0-96.0%" in said[0]


def test_too_few_conversations_and_a_single_seed_are_said() -> None:
    rows = pd.DataFrame([_row("2P6D", "live", 0, 0.95, conversations=40),
                         _row("1P7D", "pd", 0, 0.90, conversations=40)])
    said = warnings(rank(rows), rows)
    assert said[0].startswith("too small a sample to rank: a run holds 40 conversations")
    assert said[1].startswith("the first two ran on one seed")


def test_the_table_lists_ranks_and_ranges() -> None:
    text = table_text(rank(_rows()))
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["#", "layout", "policy", "SLO"]
    assert lines[1].split()[:5] == ["1", "2P6D", "live", "96.0%", "95.0-97.0"]
    assert lines[3].split()[4] == "-"  # one seed: no range
    assert lines[-1].strip().startswith("(seeds 1: screened out on the first seed")
