"""What a simulation simulated travels with its outputs (summary.json, the grid's Parquet
metadata and sidecar) and is printed; `sim paper` says how a setup differs from the paper's."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from profiler.cli import main as ppd
from profiler.simulator.provenance import (
    METADATA_KEY,
    SimulatedSetup,
    paper_differences,
    read_setup,
    report_preface,
    vllm_version_of,
)

DATASET = "synthetic:small-tiny"


def test_the_grid_records_its_setup_in_parquet_metadata_and_a_sidecar(
        hand_preset: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "grid.parquet"
    assert ppd(["sim", "grid", "--layouts", "1P1D", "--datasets", DATASET, "--qps", "1",
                "--policies", "pd,local", "--cost", hand_preset, "--model", "llama-3.1-8b",
                "--link", "rdma-400g", "--duration", "2", "--processes", "1", "--out",
                str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"simulated: preset {hand_preset}, link rdma-400g, model llama-3.1-8b, layouts " \
           "1P1D" in printed
    assert "verdict: the best fixed route per cell against P->D" in printed
    sidecar = json.loads((tmp_path / "grid.meta.json").read_text())["setup"]
    embedded = json.loads(pq.read_schema(out).metadata[METADATA_KEY])
    assert sidecar == embedded
    assert (embedded["preset"], embedded["link"], embedded["layouts"]) == (
        hand_preset, "rdma-400g", ["1P1D"])
    (tmp_path / "grid.meta.json").unlink()  # the Parquet file alone still says it
    setup = read_setup(out)
    assert setup is not None and setup.link == "rdma-400g"
    assert len(pd.read_parquet(out)) == 2


def test_sim_run_records_its_setup_in_summary_json(hand_preset: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert ppd(["sim", "run", "--layout", "1P1D", "--cost", hand_preset, "--model",
                "llama-3.1-8b", "--dataset", DATASET, "--conversation-rate", "1",
                "--duration", "2", "--policy", "pd", "--out", str(tmp_path / "run")]) == 0
    record = json.loads((tmp_path / "run" / "summary.json").read_text())["simulated_setup"]
    assert (record["preset"], record["model"], record["layouts"]) == (
        hand_preset, "llama-3.1-8b", ["1P1D"])
    assert f"simulated: preset {hand_preset}" in capsys.readouterr().out


def test_the_vllm_version_comes_from_the_preset() -> None:
    class Kernel:
        vllm_version = "0.11.0"

    class Hosted:
        kernel = Kernel()
        source = "whatever"

    class Described:
        source = "aiconfigurator-core ...: h100_sxm, vllm 0.24.0 kernel data"

    assert vllm_version_of(Hosted()) == "0.11.0"
    assert vllm_version_of(Described()) == "0.24.0"
    assert vllm_version_of(object()) is None
    assert vllm_version_of(Described(), "h100:llama-3.1-8b@vllm-0.13") == "0.13"


def test_another_setup_than_the_papers_is_said_before_any_ours_paper_cell() -> None:
    big = SimulatedSetup("h100:llama-3.1-70b:tp4", "nvlink", "llama-3.1-70b", ("1P3D",),
                         vllm_version="0.24.0")
    assert paper_differences([big]) == [
        "model llama-3.1-70b (the paper's: llama-3.1-8b)",
        "tensor parallelism tp4 (the paper's: one GPU per node)"]
    preface = "\n".join(report_preface([big]))
    assert "## Not the paper's setup" in preface and "llama-3.1-70b" in preface
    assert "preset h100:llama-3.1-70b:tp4 (vLLM 0.24.0)" in preface
    same = SimulatedSetup("h100:llama-3.1-8b", "nvlink", "llama-3.1-8b", ("1P3D",))
    assert paper_differences([same]) == []
    assert "Same model and GPU as the paper" in "\n".join(report_preface([same]))
    cpu = SimulatedSetup("tables/tiny-cpu-1p1d.preset.json", "nvlink", "tiny", ("1P1D",))
    assert any("hardware preset tables/tiny-cpu-1p1d.preset.json" in d
               for d in paper_differences([cpu]))


def test_sim_paper_on_another_setup_warns_and_says_how_it_differs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"layout": "1P3D", "dataset": "small-tiny", "qps": 1.0, "policy": policy,
             "cost": "b200:qwen3-8b", "turn2plus_ttft_ms_mean": ttft, "tpot_ms_mean": 10.0,
             "output_tok_s": 100.0, "success_rate": 1.0, "local_share": 0.0,
             "kv_bytes_moved": 0.0} for policy, ttft in (("pd", 100.0), ("local", 50.0),
                                                          ("ppd", 50.0))]
    pd.DataFrame(rows).to_parquet(tmp_path / "grid.parquet")
    assert ppd(["sim", "paper", str(tmp_path / "grid.parquet"), "--out",
                str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "not the paper's setup (model qwen3-8b" in captured.err
    assert "verdict: ppd (w_tpot 1) tied the best fixed policy in 1 of 1 cells" in captured.out
    text = (tmp_path / "out" / "tables.md").read_text()
    assert text.index("## Not the paper's setup") < text.index("## Table 1")
    assert "hardware b200 (the paper's: h100)" in text
    assert text.rstrip().endswith("and beat it in none")
