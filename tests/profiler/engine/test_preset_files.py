"""A cost preset file (`--preset FILE` / `--cost FILE`, as `ppd sim fit` and `ppd sim calibrate`
write them) that is not one says what is wrong with which key, instead of a Python error
or a run with NaN or negative step times; so do presets and steps no engine can be."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.cli import main as ppd
from profiler.engine.presets import load_cost

KERNEL = {"kind": "linear", "name": "k", "source": "tests", "base_ms": 1.0,
          "per_prefill_token_ms": 0.1, "per_decode_seq_ms": 1.0}


@pytest.mark.parametrize(("content", "message"), [
    ([1, 2], "is a JSON object"),
    ({**KERNEL, "base_ms": "abc"}, "base_ms must be a finite number >= 0 (got 'abc')"),
    ({**KERNEL, "base_ms": -100}, "base_ms must be a finite number >= 0 (got -100)"),
    ({**KERNEL, "per_decode_seq_ms": float("nan")}, "per_decode_seq_ms must be a finite"),
    ({"kind": "linear", "name": "k", "source": "s", "base_ms": 1.0},
     "missing ['per_decode_seq_ms', 'per_prefill_token_ms']"),
    ({"kind": "hosted", "name": "h", "kernel": 5, "host": {}}, "kernel must be a JSON object"),
    ({"kind": "hosted", "name": "h", "kernel": KERNEL, "host": {},
      "engine": {"block_size": "abc"}}, "engine block_size must be whole numbers > 0"),
    ({"kind": "hosted", "name": "h", "kernel": KERNEL, "host": {},
      "engine": {"num_kv_blocks": 64, "blocks": 8}}, "unknown engine key(s) ['blocks']"),
    ({"kind": "hosted", "name": "h", "kernel": KERNEL, "host": {"step_base_ms": float("nan")}},
     "host terms: step_base_ms must be a finite number >= 0"),
    ({"kind": "hosted", "name": "h", "kernel": KERNEL, "host": {"schedules_ahead": 1}},
     "schedules_ahead must be true or false"),
    ({"kind": "hosted", "name": "h", "kernel": KERNEL, "host": {"cuda_graph_sizes": [8, "x"]}},
     "cuda_graph_sizes must be a list of batch sizes"),
])
def test_a_bad_preset_file_names_its_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         content: object, message: str) -> None:
    path = tmp_path / "preset.json"
    path.write_text(json.dumps(content))
    assert ppd(["sim", "idle", "--preset", str(path), "--prompt", "100"]) == 1
    err = capsys.readouterr().err
    assert f"cost preset {path}:" in err and message in err


def test_the_shipped_preset_files_still_load() -> None:
    root = Path(__file__).resolve().parents[3]
    shipped = sorted((root / "tables").glob("*.preset.json"))
    assert shipped
    for path in shipped:
        assert load_cost(str(path)).step_ms is not None


@pytest.mark.parametrize("tp", ["tp0", "tp3", "tp16"])
def test_tensor_parallelism_is_one_a_node_has(capsys: pytest.CaptureFixture[str],
                                             tp: str) -> None:
    assert ppd(["sim", "idle", "--preset", f"h100:llama-3.1-8b:{tp}", "--prompt", "10"]) == 1
    assert "tensor parallelism must be one of tp1, tp2, tp4, tp8" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--decode", "100000000", "--context", "10"], "at most max_num_seqs 256"),
    (["--decode", "8", "--context", "100000000"], "--context 100000000 exceeds max_model_len"),
    (["--prefill", "200000"], "--prefill 200000 exceeds max_model_len"),
])
def test_sim_step_refuses_a_step_no_engine_runs(capsys: pytest.CaptureFixture[str],
                                                args: list[str], message: str) -> None:
    assert ppd(["sim", "step", "--preset", "h100:llama-3.1-8b", *args]) == 1
    assert message in capsys.readouterr().err
