"""`ppd sim compare` (profiler.planning.compare, compare_cells, compare_report): the history a
window recomputes, the pooled table, issue #43's verdict, the flags' errors, and one small run
of the shipped Mooncake sample end to end."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from profiler.planning import compare
from profiler.planning.compare_cells import computed_prompt_tokens, novel_tokens
from profiler.planning.compare_report import cell_table, verdict_lines, write_report

SAMPLE = Path(__file__).resolve().parents[3] / "datasets" / "samples" / "mooncake_sample.jsonl"


def test_a_prompt_is_new_but_for_its_leading_blocks_seen_before() -> None:
    prompts = [(1024 + 100, (1, 2, 3)),  # all new: 1,124
               (1536 + 10, (1, 2, 4, 5)),  # blocks 1, 2 seen: 522 new
               (1536, (1, 9, 3)),  # 9 breaks the chain: 3 is not reused after it
               (700, (1, 2))]  # block 2 is partial here: only block 1 counts
    assert novel_tokens(prompts) == 1124 + 522 + 1024 + 188


def test_computed_tokens_leave_out_cache_hits_and_reads_from_another_node() -> None:
    stats = {"p": {"prefix_cache_queries": 1000, "prefix_cache_hits": 200},
             "d": {"prefix_cache_queries": 1000, "prefix_cache_hits": 0,
                   "external_prefix_cache_hits": 999}}
    assert computed_prompt_tokens(stats) == 800 + 1


def _row(layout: str, scale: float, policy: str, window: int, met: int, n: int = 100,
         ) -> dict[str, object]:
    return {"layout": layout, "qps": scale, "policy": policy, "window": window,
            "n_requests": n, "slo_met": met, "success_rate": 1.0,
            "turn2plus_ttft_ms_p50": 100.0 + window, "turn2plus_ttft_ms_p90": 300.0,
            "tpot_ms_p50": 10.0, "tpot_ms_p90": 20.0, "history_tokens_recomputed": 1e6,
            "kv_bytes_moved": 2e9, "local_share": 0.5}


def _grid(live_met: tuple[int, int]) -> pd.DataFrame:
    rows = []
    for scale in (1.0, 2.0, 4.0):
        for window in (0, 1):
            rows += [_row("2P6D", scale, "pd", window, 60), _row("2P6D", scale, "dynamo",
                                                                  window, 70),
                     _row("2P6D", scale, "live", window, live_met[window])]
    return pd.DataFrame(rows)


def test_windows_pool_their_turns_and_sum_their_work() -> None:
    table = cell_table(_grid((90, 70)))
    live = table[(table["policy"] == "live") & (table["time_scale"] == 1.0)].iloc[0]
    assert live["slo_attainment"] == pytest.approx(160 / 200)
    assert live["turns"] == 200 and live["windows"] == 2
    assert live["ttft2_p50_ms"] == pytest.approx(100.5)  # the windows' p50s averaged
    assert live["history_recomputed_mtok"] == pytest.approx(2.0)
    assert live["kv_moved_gb"] == pytest.approx(4.0)


def test_the_verdict_meets_the_bar_only_when_live_leads_everywhere() -> None:
    won = verdict_lines(cell_table(_grid((90, 70))))  # live 0.80 vs dynamo 0.70: +14%
    assert "highest 0.800 (live)" in won[0] and "(live +14.3%)" in won[0]
    assert won[-1].endswith("MET") and "3/3 cells" in won[-1]
    lost = verdict_lines(cell_table(_grid((70, 66))))  # live 0.68 vs dynamo 0.70
    assert "highest 0.700 (dynamo)" in lost[0]
    assert lost[-1].endswith("NOT MET") and "live within 0.02 of the highest in 3/3" in lost[-1]
    assert ">= 10% over the best anchor in 0/3" in lost[-1]


def test_overlapping_windows_are_refused() -> None:
    with pytest.raises(ValueError, match="overlap"):
        compare.main([str(SAMPLE), "--out", "unused", "--starts", "0,60", "--duration", "100"])


def test_a_trace_without_timestamps_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a timed block-hash trace"):
        compare.main(["sharegpt", "--out", str(tmp_path), "--starts", "0"])


def test_a_report_needs_its_grid(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        compare.main([str(SAMPLE), "--out", str(tmp_path), "--grid", str(tmp_path / "x.pq")])


def test_one_small_comparison_of_the_sample_end_to_end(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    assert compare.main([str(SAMPLE), "--out", str(tmp_path), "--layouts", "1P1D",
                         "--time-scales", "4", "--starts", "0,20", "--duration", "8",
                         "--policies", "pd,local,dynamo,live", "--processes", "1"]) == 0
    grid = pd.read_parquet(tmp_path / "grid.parquet")
    assert sorted(grid["policy"].unique()) == ["dynamo", "live", "local", "pd"]
    assert sorted(grid["window"].unique()) == [0, 1] and len(grid) == 8
    assert not (tmp_path / "grid.partial.jsonl").exists()  # only a stopped grid leaves it
    assert grid["slo_attainment"].between(0, 1).all()
    assert (grid["n_requests"] > 0).all()
    # the same window sends the same requests under every policy
    assert grid.groupby("window")["n_requests"].nunique().eq(1).all()
    printed = capsys.readouterr().out
    assert "| 1P1D | 4 |" in printed and "issue #43's bar" in printed
    assert (tmp_path / "attainment.png").stat().st_size > 0
    report = write_report(grid, tmp_path / "again")  # --grid's path: the same table
    assert (tmp_path / "again" / "table.md").read_text() == (tmp_path / "table.md").read_text()
    assert report[-1].startswith("wrote")


def test_without_a_trace_or_a_grid_there_is_nothing_to_compare(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="give the trace"):
        compare.main(["--out", str(tmp_path)])
