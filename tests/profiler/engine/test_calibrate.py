"""`ppd sim calibrate` recovers a known preset from runs the simulator made with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.cli import main as ppd
from profiler.engine import LinearCost, load_cost
from profiler.engine.calibrate import calibrate, huber_line, parse_metrics
from profiler.engine.host import HostedCost, HostModel
from profiler.engine.presets import register, to_dict
from profiler.replay.output import records_frame
from profiler.simulator.layout import Layout
from profiler.simulator.run import RunSpec, simulate
from proxy.vocabulary import RouteKind

# A CPU-like truth: a 2 ms step + 1.5 ms per decoding request; a prompt costs 20 ms +
# 0.03 ms per token; 30 ms of front end per node request; a 50 ms P->D hand-off.
TRUTH = HostedCost(
    "truth", LinearCost("truth-kernel", "tests", base_ms=0.0, per_prefill_token_ms=0.03,
                        per_decode_seq_ms=1.5),
    HostModel(frontend_request_ms=30.0, step_base_ms=2.0, step_per_prefill_ms=20.0,
              kv_handoff_ms=50.0),
    engine={"block_size": 128, "max_num_batched_tokens": 4096, "max_model_len": 4096})
register("test-calibrate-truth", lambda: TRUTH)


def metrics_text(stats: dict[str, float]) -> str:
    """A node's simulated counters as vLLM's /metrics text (engine and model labels)."""
    labels = '{engine="0",model_name="tiny"}'
    requests = stats.get("requests", 0.0)
    lines = [f"vllm:{name}{labels} {stats.get(name, 0.0)}" for name in (
        "time_to_first_token_seconds_sum", "request_queue_time_seconds_sum",
        "request_prefill_time_seconds_sum", "inter_token_latency_seconds_sum",
        "inter_token_latency_seconds_count")]
    lines += [f"vllm:{name}_count{labels} {requests}" for name in (
        "time_to_first_token_seconds", "request_queue_time_seconds",
        "request_prefill_time_seconds")]
    lines += [f'vllm:inter_token_latency_seconds_bucket{{le="0.01"}} {requests}',
              f"vllm:prompt_tokens_total{labels} {stats.get('prompt_tokens', 0.0)}",
              f"vllm:prefix_cache_hits_total{labels} {stats.get('prefix_cache_hits', 0)}",
              f"vllm:external_prefix_cache_hits_total{labels} "
              f"{stats.get('external_prefix_cache_hits', 0)}"]
    return "\n".join(["# HELP vllm:x y", *lines]) + "\n"


def make_run(root: Path, dataset: str, qps: float, route: RouteKind) -> Path:
    spec = RunSpec(layout="1P1D", dataset=dataset, qps=qps, cost="test-calibrate-truth",
                   model="tiny", duration_s=30.0, seed=3, max_turns=2, forced_route=route)
    result = simulate(spec)
    out = root / f"{dataset.split(':')[1]}@{qps}-{route.value}"
    out.mkdir(parents=True)
    records_frame(result.records).to_csv(out / "requests.csv", index=False)
    for node in Layout.parse("1P1D").nodes():
        name = f"{node.role.value}-{node.name}"
        (out / f"metrics-before-{name}.txt").write_text("")
        (out / f"metrics-after-{name}.txt").write_text(metrics_text(result.node_stats[node.url]))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("calibration")
    return [make_run(root, dataset, qps, route)
            for dataset in ("synthetic:small-mid_bal", "synthetic:small-big_paste")
            for qps in (0.5, 2.0) for route in (RouteKind.LOCAL, RouteKind.PD)]


def test_calibrate_recovers_the_preset_that_made_the_runs(runs: list[Path]) -> None:
    fitted = calibrate(runs, name="fitted").cost
    kernel, host = fitted.kernel, fitted.host
    assert isinstance(kernel, LinearCost)
    assert kernel.per_decode_seq_ms == pytest.approx(1.5, rel=0.15)
    assert host.step_base_ms == pytest.approx(2.0, abs=1.0)
    assert kernel.per_prefill_token_ms == pytest.approx(0.03, rel=0.25)
    assert host.step_per_prefill_ms + host.step_base_ms == pytest.approx(22.0, rel=0.1)
    assert host.frontend_request_ms == pytest.approx(30.0, rel=0.15)
    assert host.kv_handoff_ms + host.kv_per_token_us * 300 / 1000 == pytest.approx(
        50.0, rel=0.25)
    assert fitted.engine["block_size"] == 128
    assert set(host.sources) >= {"frontend_request_ms", "step_base_ms", "kv_handoff_ms"}


def test_calibrate_cli_writes_a_preset_cost_and_emulate_accept(runs: list[Path], tmp_path,
                                                               capsys) -> None:
    out = tmp_path / "cpu.json"
    assert ppd(["sim", "calibrate", *map(str, runs[:4]), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "front end" in text and "hand-off" in text
    cost = load_cost(str(out))
    assert isinstance(cost, HostedCost) and cost.name == "cpu"
    assert json.loads(out.read_text())["kind"] == "hosted"
    from profiler.emulate.presets import resolve

    assert resolve(str(out), "tiny").cost.name == "cpu"


def test_calibrate_errors_say_what_is_missing(runs: list[Path], tmp_path, capsys) -> None:
    assert ppd(["sim", "calibrate", str(runs[0]), "--out", str(tmp_path / "x.json")]) == 1
    assert "at least 2 runs" in capsys.readouterr().err
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "requests.csv").write_text((runs[0] / "requests.csv").read_text())
    assert ppd(["sim", "calibrate", str(bare), str(runs[1]), "--out",
                str(tmp_path / "x.json")]) == 1
    assert "metrics-after-NODE.txt" in capsys.readouterr().err
    # only P->D runs: nothing shows the front end of a local turn
    pd_only = [run for run in runs if run.name.endswith("-pd")]
    assert ppd(["sim", "calibrate", *map(str, pd_only), "--out", str(tmp_path / "x.json")]) == 1
    assert "force-route local" in capsys.readouterr().err


def test_huber_line_ignores_outliers_that_move_least_squares() -> None:
    x = list(range(20))
    y = [3.0 + 2.0 * v for v in x]
    y[5] += 500.0  # one burst, as a loaded machine's client sees
    intercept, slope = huber_line(x, y)
    assert slope == pytest.approx(2.0, rel=0.02) and intercept == pytest.approx(3.0, abs=0.5)


def test_parse_metrics_sums_label_sets_and_skips_buckets() -> None:
    text = ('vllm:prompt_tokens_total{engine="0"} 10\nvllm:prompt_tokens_total{engine="1"} 5\n'
            'vllm:x_bucket{le="1"} 3\n# HELP y\nvllm:y_created 17\n')
    assert parse_metrics(text) == {"prompt_tokens_total": 15.0}


def test_to_dict_refuses_a_kernel_it_cannot_write(h100) -> None:
    with pytest.raises(ValueError, match="LinearCost"):
        to_dict(HostedCost("x", h100, HostModel()))
