from __future__ import annotations

import random

import pandas as pd
import pytest

from profiler.cli import main as ppd
from profiler.engine import Engine, EngineConfig, LinearCost, Request, load_cost, simulate
from profiler.replay.output import records_frame
from profiler.traces.request_records import RequestRecord

TRUTH = LinearCost("truth", "tests", base_ms=20.0, per_prefill_token_ms=0.5,
                   per_decode_seq_ms=3.0)


def replay_rows(seed: int = 5) -> pd.DataFrame:
    """A replay-format requests table made by the engine model itself with TRUTH's costs."""
    rng = random.Random(seed)
    engine = Engine(EngineConfig(max_num_batched_tokens=4096), TRUTH)
    arrivals, t = [], 0.0
    for i in range(60):
        t += rng.expovariate(1.0)
        arrivals.append((t, Request(f"r{i}", max_tokens=rng.randint(20, 200),
                                    prompt_token_ids=[rng.randrange(1000) for _ in
                                                      range(rng.randint(50, 1500))])))
    result = simulate(engine, arrivals)
    records = []
    for (start, request), outcome in zip(arrivals, result.outcomes.values(), strict=True):
        assert outcome.finish is not None and outcome.ttft is not None
        times = outcome.token_times
        records.append(RequestRecord(
            conversation_id=request.id, turn=1, route="replica", decode=None, prefill=None,
            start_s=start, ttft_s=outcome.ttft, tpot_s=outcome.tpot,
            e2e_s=outcome.finish - start,
            itl_s=tuple(b - a for a, b in zip(times, times[1:], strict=False)),
            n_input_tokens=request.num_prompt_tokens, n_output_tokens=len(times),
            success=True, error=None, status=200, max_tokens=request.max_tokens))
    # the columns `ppd replay` writes (ms; its CSV joins the ITLs with ';')
    frame = records_frame(records)
    frame["itl_ms"] = [";".join(f"{gap:.3f}" for gap in gaps) for gaps in frame["itl_ms"]]
    return frame


def test_fit_recovers_the_cost_that_made_the_rows(tmp_path, capsys):
    run = tmp_path / "replica-run"
    run.mkdir()
    replay_rows().to_csv(run / "requests.csv", index=False)
    out = tmp_path / "cpu.json"
    assert ppd(["sim", "fit", str(run), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    fitted = load_cost(str(out))
    assert isinstance(fitted, LinearCost) and fitted.name == "cpu"
    assert fitted.per_prefill_token_ms == pytest.approx(0.5, rel=0.05)
    assert fitted.per_decode_seq_ms == pytest.approx(3.0, rel=0.15)
    assert fitted.base_ms == pytest.approx(20.0, rel=0.15)


def test_fit_errors_are_one_clear_line(tmp_path, capsys):
    assert ppd(["sim", "fit", str(tmp_path), "--out", str(tmp_path / "x.json")]) == 1
    assert "no requests.csv" in capsys.readouterr().err
    pd.DataFrame({"turn": [1]}).to_csv(tmp_path / "requests.csv", index=False)
    assert ppd(["sim", "fit", str(tmp_path), "--out", str(tmp_path / "x.json")]) == 1
    assert "not a replay requests file" in capsys.readouterr().err


def test_step_prints_the_modelled_step_time(capsys):
    args = ["--decode", "32", "--context", "2048", "--prefill", "256"]
    assert ppd(["sim", "step", "--preset", "h100:llama-3.1-8b:kernels", *args]) == 0
    out = capsys.readouterr().out
    assert "12.70 ms per step" in out and "h100_sxm" in out
    # The default preset adds vLLM's host side: 33 scheduled requests' bookkeeping.
    assert ppd(["sim", "step", "--preset", "h100:llama-3.1-8b", *args]) == 0
    out = capsys.readouterr().out
    assert "kernels 12.70 ms + host" in out and "ms per step" in out


def test_step_and_presets_errors(capsys):
    assert ppd(["sim", "step", "--preset", "h100:llama-3.1-8b"]) == 1
    assert "empty step" in capsys.readouterr().err
    assert ppd(["sim", "step", "--preset", "z80:llama-3.1-8b", "--prefill", "5"]) == 1
    assert "unknown cost preset" in capsys.readouterr().err
    assert ppd(["sim", "presets"]) == 0
    out = capsys.readouterr().out
    assert "h100:llama-3.1-8b" in out and "rdma-400g" in out and "131072" in out
