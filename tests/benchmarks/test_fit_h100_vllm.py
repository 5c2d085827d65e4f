"""`python -m benchmarks.fit_h100_vllm`: the refit an H100 owner runs after measuring again.

It broke once without a test noticing (the API server's queue changed its constructor), so
these run its two parts on the committed measurements: the fit with its error tables, and the
replay of the micro-benchmark on one simulated engine."""

from __future__ import annotations

import pytest

from benchmarks import fit_h100_vllm
from profiler.engine import measured
from profiler.engine.presets import load_cost


@pytest.fixture(scope="module")
def data() -> measured.Measurements:
    return measured.read(measured.DATA)


def test_the_refit_prints_its_terms_and_in_and_out_of_sample_errors(capsys) -> None:
    assert fit_h100_vllm.main(["--no-replay"]) == 0
    out = capsys.readouterr().out
    assert "fitted on every length and batches 1-100: frontend_request_ms" in out
    assert "### out of sample: fitted on half, the rest predicted" in out
    # every measured length and batch gets a row in both tables
    assert out.count("| 8000 |") == 2 and out.count("| 200 | held out |") == 2
    assert "TPOT held out: median |error|" in out


@pytest.mark.parametrize("batch", [1, 10])
def test_the_micro_benchmark_replay_tracks_the_measured_tpot(data, batch: int) -> None:
    """The replay (histories, then B requests of 2,048 cached + 32 new tokens through one
    API server) against the same sitting's mean TPOT: within 10% at 1 and 10 requests
    (docs/engine-model.md, "Validation": -5% and +1%)."""
    measured_tpot = data.decode_means()[batch].tpot_ms
    ttft, tpot = fit_h100_vllm.micro_benchmark(load_cost("h100:llama-3.1-8b"), batch)
    assert tpot == pytest.approx(measured_tpot, rel=0.10)
    # a burst of B reaches the engine one API-server service apart: TTFT grows with B
    assert ttft > (fit_h100_vllm.micro_benchmark(load_cost("h100:llama-3.1-8b"), 1)[0]
                   if batch > 1 else 0.0)


def test_the_cache_sweep_brackets_vllms_own_computed_tokens(capsys) -> None:
    """vLLM computed 841 prompt tokens per request at 200 (histories partly evicted): the
    model's own cache computes them all, a cache 5% larger almost none; the sweep prints
    both beside the measured count (docs/engine-model.md, "Validation")."""
    assert fit_h100_vllm.main(["--sweep-blocks", "25014,26200"]) == 0
    out = capsys.readouterr().out
    assert "vLLM computed 841 prompt tokens per request" in out
    rows = {int(line.split("|")[1]): float(line.split("|")[2])
            for line in out.splitlines() if line.startswith("| 2")}
    assert rows[25014] > 841 > rows[26200]
