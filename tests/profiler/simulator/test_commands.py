"""`ppd sim run`, `ppd sim grid`, `ppd profile --backend sim`: files, formats, errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from profiler.cli import main as ppd
from profiler.replay import report
from profiler.simulator.grid import grid_cells, paper_datasets, parse_policy, run_grid
from profiler.simulator.run import RunSpec
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.policies.table import DecisionTable

DATASET = "synthetic:small-mid_bal"


def _run(preset: str, out: Path, *extra: str) -> int:
    return ppd(["sim", "run", "--layout", "1P2D", "--cost", preset, "--model", "llama-3.1-8b",
                "--dataset", DATASET, "--qps", "2", "--duration", "3", "--out", str(out),
                *extra])


def test_sim_run_writes_a_replay_run_that_report_compare_reads(
        hand_preset: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(hand_preset, tmp_path / "pd@2", "--policy", "pd") == 0
    assert _run(hand_preset, tmp_path / "local@2", "--policy", "local") == 0
    printed = capsys.readouterr().out
    assert "turn-2+ TTFT" in printed and "simulated" in printed
    document = json.loads((tmp_path / "pd@2" / "summary.json").read_text())
    assert document["simulated"] is True and document["config"]["cost"] == hand_preset
    assert document["config"]["qps"] == 2.0 and document["label"] == "pd@2"
    frame = pd.read_csv(tmp_path / "local@2" / "requests.csv")
    assert set(frame["route"]) == {"pd", "local"} and frame["success"].all()
    table, _ = report.compare([tmp_path / "pd@2", tmp_path / "local@2"], tmp_path / "cmp")
    assert "pd@2" in table and "local@2" in table


@pytest.mark.parametrize(("args", "message"), [
    (["--policy", "ppd"], "needs --table"),
    (["--policy", "replica"], "needs R nodes"),
    (["--policy", "fixed"], "needs --x"),
    (["--policy", "pd", "--layout", "3P"], "bad layout|prefill and decode"),
])
def test_sim_run_errors_are_one_clear_line(
        hand_preset: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        args: list[str], message: str) -> None:
    assert _run(hand_preset, tmp_path / "x", *args) == 1
    err = capsys.readouterr().err
    assert err.startswith("ppd sim: error:") and err.count("\n") == 1
    assert re.search(message, err)


def test_unknown_cost_preset_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run("h100:no-such-model", tmp_path / "x", "--policy", "pd") == 1
    assert "unknown cost preset" in capsys.readouterr().err


def test_grid_skips_policies_a_layout_cannot_run(hand_preset: str) -> None:
    base = RunSpec(layout="1P1D", dataset=DATASET, qps=1.0, cost=hand_preset,
                   model="llama-3.1-8b", duration_s=2.0)
    cells = grid_cells(["2R", "1P1D"], [DATASET], [1.0, 2.0], ["replica", "pd", "x=0.5"],
                       base, lambda layout: None)
    assert sorted({(c.spec.layout, c.policy) for c in cells}) == [
        ("1P1D", "pd"), ("1P1D", "x=0.5"), ("2R", "replica")]
    rows = run_grid(cells, processes=1)
    assert len(rows) == 6 and all(row["success_rate"] == 1.0 for row in rows)
    assert {row["policy"] for row in rows if row["layout"] == "2R"} == {"replica"}
    kv = {row["policy"]: row["kv_bytes_moved"] for row in rows if row["qps"] == 2.0}
    assert kv["replica"] == 0 < kv["x=0.5"] < kv["pd"]


def test_grid_command_writes_one_row_per_run(hand_preset: str, tmp_path: Path) -> None:
    out = tmp_path / "grid.csv"
    assert ppd(["sim", "grid", "--layouts", "1P1D", "--datasets", DATASET, "--qps", "1,2",
                "--policies", "pd,local", "--cost", hand_preset, "--model", "llama-3.1-8b",
                "--duration", "2", "--processes", "2", "--out", str(out),
                "--no-progress"]) == 0
    frame = pd.read_csv(out)
    assert len(frame) == 4 and set(frame["policy"]) == {"pd", "local"}
    assert frame.loc[frame["policy"] == "local", "local_share"].eq(1.0).all()


def test_paper_datasets_are_the_papers_18_without_huge() -> None:
    datasets = paper_datasets()
    assert len(datasets) == 18 and datasets[0] == "synthetic:small-tiny"
    assert datasets[-1] == "synthetic:large-huge_paste"
    assert not any(name.startswith("synthetic:huge-") for name in datasets)


@pytest.mark.parametrize(("label", "expected"), [
    ("pd", PolicyConfig(kind=Policy.PD)),
    ("x=0.33", PolicyConfig(kind=Policy.FIXED, x=0.33)),
    ("threshold-256", PolicyConfig(kind=Policy.THRESHOLD, non_cached_tokens=256)),
    ("ppd-wtpot3", PolicyConfig(kind=Policy.PPD, table=Path("t.csv"), w_tpot=3.0)),
])
def test_policy_labels(label: str, expected: PolicyConfig) -> None:
    assert parse_policy(label, Path("t.csv")) == expected


def test_profile_backend_sim_writes_a_table_the_proxy_loads(
        hand_preset: str, tmp_path: Path) -> None:
    out = tmp_path / "table.csv"
    assert ppd(["profile", "--backend", "sim", "--layout", "1P1D", "--cost", hand_preset,
                "--model", "llama-3.1-8b", "--contexts", "small", "--workloads",
                "tiny,big_paste", "--request-rate", "2", "--duration", "4", "--out", str(out),
                "--no-progress"]) == 0
    table = DecisionTable.load(out)
    assert len(table) == 2 and table.meta["simulated"] is True
    assert table.meta["cost"] == hand_preset and "--backend sim" in table.meta["command"]
    row = table.rows()[0]
    assert row.pd_ttft_ms > 0 and row.local_ttft_ms > 0 and row.pd_success == 1.0


def test_profile_backend_sim_with_readback_measures_the_third_route(
        hand_preset: str, tmp_path: Path) -> None:
    out = tmp_path / "table.csv"
    assert ppd(["profile", "--backend", "sim", "--layout", "1P1D", "--cost", hand_preset,
                "--model", "llama-3.1-8b", "--contexts", "large", "--workloads", "big_paste",
                "--request-rate", "2", "--duration", "4", "--readback", "--out", str(out),
                "--no-progress"]) == 0
    table = DecisionTable.load(out)
    assert table.has_readback
    row = table.rows()[0]
    # P reads the history back instead of recomputing it: a first token sooner than P->D's.
    assert 0 < row.readback_ttft_ms < row.pd_ttft_ms and row.readback_success == 1.0


def test_profile_backend_sim_needs_a_layout(hand_preset: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert ppd(["profile", "--backend", "sim", "--cost", hand_preset,
                "--out", str(tmp_path / "t.csv")]) == 1
    assert "--layout" in capsys.readouterr().err


def test_readback_is_on_by_default_and_off_for_the_papers_client() -> None:
    from profiler.simulator.flags import readback_ttl
    from profiler.simulator.grid import build_parser as grid_parser

    def ttl(*flags: str) -> float | None:
        return readback_ttl(grid_parser().parse_args(["--out", "g.parquet", *flags]))

    assert ttl() == 480.0  # vLLM's decoder_kv_blocks_ttl, as `ppd cluster up` sets it
    assert ttl("--client", "paper") is None  # the paper's testbed: no bidirectional transfer
    assert ttl("--client", "paper", "--kv-readback-ttl", "60") == 60.0
    assert ttl("--no-kv-readback") is None
    with pytest.raises(ValueError, match="must be > 0"):
        ttl("--kv-readback-ttl", "0")
