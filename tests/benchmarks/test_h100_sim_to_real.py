"""benchmarks/h100_sim_to_real.py: one sim-to-real stage simulated on the H100 presets."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.h100_sim_to_real import main, predict
from profiler.engine import load_cost, public


def test_stage_means_come_from_the_measured_means() -> None:
    stage = public.SIM_TO_REAL_STAGES[0]
    assert (stage.experiment, stage.rate) == (16, 8.0)
    assert stage.tpot_mean_ms == pytest.approx((1892.699 - 25.226) / 247)


def test_host_side_and_async_scheduling_move_the_prediction_the_right_way() -> None:
    stage = public.SIM_TO_REAL_STAGES[0]
    hosted = load_cost("h100:llama-3.1-8b@vllm-0.13")  # the paper's engine, sync scheduling
    overlapped = replace(hosted, host=replace(hosted.host, async_scheduling=True))
    ttft_sync, tpot_sync = predict(stage, hosted, seconds=5.0)
    ttft_async, tpot_async = predict(stage, overlapped, seconds=5.0)
    ttft_kernels, tpot_kernels = predict(stage, load_cost("h100:llama-3.1-8b:kernels"), 5.0)
    # the front end is on every TTFT; the kernels alone have none
    assert ttft_kernels + hosted.host.frontend_request_ms <= ttft_async * 1.05
    # async scheduling hides the per-step host time behind the kernels
    assert tpot_kernels <= tpot_async < tpot_sync


def test_the_report_prints_every_stage(capsys) -> None:
    assert main(["--seconds", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("| general |") == 8 and "median |error|" in out
