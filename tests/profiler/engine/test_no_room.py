"""A model that leaves no memory for a KV cache on one GPU: the error names the ways out."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.cli import main as ppd
from profiler.engine.aic import load_preset


def test_a_70b_model_on_one_h100_names_tensor_parallelism_and_larger_gpus() -> None:
    with pytest.raises(ValueError, match=r"`h100:llama-3.1-70b:tp2` \(e\.g\. "
                       r"`h100:llama-3.1-70b:tp4`\).*b200:llama-3.1-70b.*shorter context"):
        load_preset("h100:llama-3.1-70b").kv_blocks()


def test_sim_grid_says_so_without_a_traceback(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert ppd(["sim", "grid", "--cost", "h100:llama-3.1-70b", "--layouts", "1P1D",
                "--datasets", "synthetic:small-tiny", "--qps", "1", "--policies", "pd",
                "--processes", "1", "--duration", "1", "--no-progress",
                "--out", f"{tmp_path}/grid.parquet"]) == 1
    err = capsys.readouterr().err
    assert ":tp" in err and "Traceback" not in err
