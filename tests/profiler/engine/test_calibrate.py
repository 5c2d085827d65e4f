"""`ppd sim calibrate` recovers a known preset from runs the simulator made with it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from profiler.cli import main as ppd
from profiler.engine import LinearCost, load_cost
from profiler.engine.calibrate import (
    calibrate,
    fit_probe,
    huber_line,
    parse_metrics,
    probe_frontend_per_running_ms,
    probe_frontend_per_token_us,
    probe_node_frontend,
    read_run,
    reply_hit_share,
)
from profiler.engine.host import HostedCost, HostModel
from profiler.engine.presets import register, to_dict
from profiler.replay.output import records_frame
from profiler.simulator.layout import sim_nodes
from profiler.simulator.run import RunSpec, simulate
from proxy.shared.vocabulary import Layout, RouteKind

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


def make_run(root: Path, dataset: str, qps: float, route: RouteKind, *,
             reply_retokenized: bool = False) -> Path:
    spec = RunSpec(layout="1P1D", dataset=dataset, qps=qps, cost="test-calibrate-truth",
                   model="tiny", duration_s=30.0, seed=3, max_turns=2, forced_route=route,
                   reply_retokenized=reply_retokenized)
    result = simulate(spec)
    out = root / f"{dataset.split(':')[1]}@{qps}-{route.value}"
    out.mkdir(parents=True)
    records_frame(result.records).to_csv(out / "requests.csv", index=False)
    # what `ppd replay` writes and the hand-off's second pass simulates the run again from
    (out / "summary.json").write_text(json.dumps({"dataset": dataset, "config": {
        "qps": qps, "duration_s": 30.0, "timeout_s": 30.0, "seed": 3, "max_turns": 2}}))
    for node in sim_nodes(Layout.parse("1P1D")):
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


# -- the shape probe's fit, reply re-tokenization, the hand-off's second pass -------------------

def probe_rows(constant: float, per_token: float, attention: float, budget: int,
               frontend_us: float = 0.0) -> pd.DataFrame:
    """Probe rows as a node with this prefill step would time them (no noise)."""
    def prefill(computed: int, context: int) -> float:
        total = 0.0
        while computed > 0:
            chunk = min(computed, budget)
            total += constant + per_token * chunk + attention * chunk * (context + chunk / 2) / 1000
            context, computed = context + chunk, computed - chunk
        return total

    rows = []
    for n in (128, 512, 1024, 2048, 3072):
        for kind, prompt, computed in (("cold", n, n), ("hit", n, 128),
                                       ("append", n + 256, 256), ("text", n, n)):
            time_ms = prefill(computed, prompt - computed)
            rows.append({"kind": kind, "prompt_tokens": prompt, "computed_tokens": computed,
                         "prefill_ms": time_ms, "queue_ms": 0.1,
                         "client_ms": 5.0 + frontend_us * prompt / 1000 + time_ms + 0.1})
    return pd.DataFrame(rows)


def test_fit_probe_separates_token_and_attention_terms_across_chunks() -> None:
    constant, per_token, attention = fit_probe(probe_rows(6.0, 0.006, 0.008, 2048), 2048)
    assert constant == pytest.approx(6.0, rel=0.01)
    assert per_token == pytest.approx(0.006, rel=0.01)
    assert attention == pytest.approx(0.008, rel=0.01)
    # one chunk per prompt when the budget holds it: the fit must know the budget
    wrong = fit_probe(probe_rows(6.0, 0.006, 0.008, 2048), 4096)
    assert wrong[0] != pytest.approx(6.0, rel=0.01)


def test_probe_frontend_slope_comes_from_the_text_prompts_only() -> None:
    rows = probe_rows(6.0, 0.006, 0.008, 2048, frontend_us=2.5)
    assert probe_frontend_per_token_us(rows) == pytest.approx(2.5, rel=0.01)
    assert probe_frontend_per_token_us(rows[rows["kind"] != "text"]) == 0.0
    # prompts through the proxy, when the probe has them, are the path replayed turns take
    proxied = rows[rows["kind"] == "text"].assign(
        kind="chat-via-proxy", client_ms=lambda f: f["client_ms"] + 3.0 * f["prompt_tokens"] / 1000)
    assert probe_frontend_per_token_us(pd.concat([rows, proxied])) == pytest.approx(5.5, rel=0.01)


def busy_rows(per_running_ms: float) -> pd.DataFrame:
    """busy-text rows of a D whose front end waits per_running_ms per request it runs, with
    one slow outlier per cell that the cell medians must ignore."""
    rows = []
    for running in (0, 4, 12, 24):
        for prompt in (256, 2048):
            for repeat in range(5):
                outside = 5.0 + 0.002 * prompt + per_running_ms * running + (
                    40.0 if repeat == 0 else 0.1 * repeat)
                rows.append({"kind": "busy-text", "prompt_tokens": prompt + repeat,
                             "computed_tokens": prompt, "prefill_ms": 20.0, "queue_ms": 0.1,
                             "client_ms": outside + 20.1, "running": running})
    return pd.DataFrame(rows)


def test_probe_per_running_slope_comes_from_busy_rows_at_several_levels() -> None:
    assert probe_frontend_per_running_ms(busy_rows(0.7)) == pytest.approx(0.7, abs=0.02)
    assert probe_frontend_per_running_ms(busy_rows(0.0)) == pytest.approx(0.0, abs=0.02)
    idle = busy_rows(0.7)
    assert probe_frontend_per_running_ms(idle[idle["running"] == 0]) == 0.0
    # a probe file from before busy-text rows existed has no running column
    assert probe_frontend_per_running_ms(probe_rows(6.0, 0.006, 0.008, 2048)) == 0.0


def test_the_node_part_of_the_front_end_comes_from_prompts_sent_straight_to_it() -> None:
    rows = probe_rows(6.0, 0.006, 0.008, 2048, frontend_us=2.5)
    constant, per_token = probe_node_frontend(rows)
    assert constant == pytest.approx(5.0, rel=0.01) and per_token == pytest.approx(2.5, rel=0.01)
    assert probe_node_frontend(rows[rows["kind"] != "text"]) == (0.0, 0.0)
    # what a node sleeps when emulated: its part, never more than the whole
    host = HostModel(frontend_request_ms=9.0, frontend_per_token_us=3.0, frontend_node_ms=5.0,
                     frontend_node_per_token_us=2.5)
    assert host.node_side().frontend_s(1000) == pytest.approx(0.0075)
    assert HostModel(frontend_request_ms=4.0, frontend_node_ms=5.0).node_side(
        ).frontend_request_ms == 4.0
    assert HostModel(frontend_request_ms=9.0).node_side().frontend_request_ms == 9.0


def test_host_frontend_grows_with_the_prompt_and_the_running_batch() -> None:
    host = HostModel(frontend_request_ms=10.0, frontend_per_token_us=2.0,
                     frontend_per_running_ms=0.5)
    assert host.frontend_s(0) == pytest.approx(0.010)
    assert host.frontend_s(1000) == pytest.approx(0.012)
    assert host.frontend_s(1000, running=8) == pytest.approx(0.016)
    assert HostModel.from_dict(host.to_dict()) == host


def test_retokenized_replies_are_recomputed_and_calibrate_sees_it(tmp_path: Path) -> None:
    # turn 1 of large-mid_bal replies 1,024 tokens: 8 blocks a turn 2 can hit or recompute
    same = make_run(tmp_path / "same", "synthetic:large-mid_bal", 0.5, RouteKind.LOCAL)
    other = make_run(tmp_path / "other", "synthetic:large-mid_bal", 0.5, RouteKind.LOCAL,
                     reply_retokenized=True)
    computed = {name: read_run(run).nodes for name, run in (("same", same), ("other", other))}
    decode = {name: next(n for n in nodes if n.role == "decode").computed_prompt_tokens
              for name, nodes in computed.items()}
    # turn 2 recomputes turn 1's reply when it comes back as other ids
    assert decode["other"] > decode["same"] * 1.5
    assert reply_hit_share([read_run(same)], 128) == pytest.approx(1.0, abs=0.05)
    assert reply_hit_share([read_run(other)], 128) == pytest.approx(0.0, abs=0.05)


def test_calibrate_with_a_probe_and_the_second_pass(runs: list[Path], tmp_path: Path,
                                                    capsys) -> None:
    probe = tmp_path / "probe.csv"
    # timed with the CLI's token budget for a NIXL cluster (vLLM-CPU's 2048)
    probe_rows(22.0, 0.03, 0.0, 2048, frontend_us=1.0).to_csv(probe, index=False)
    out = tmp_path / "probed.json"
    assert ppd(["sim", "calibrate", *map(str, runs), "--probe", str(probe),
                "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "settled on the simulated runs" in text
    cost = load_cost(str(out))
    assert isinstance(cost, HostedCost) and isinstance(cost.kernel, LinearCost)
    assert cost.kernel.per_prefill_token_ms == pytest.approx(0.03, rel=0.01)
    assert cost.host.frontend_per_token_us == pytest.approx(1.0, rel=0.01)
    assert cost.host.frontend_node_ms == pytest.approx(5.0, rel=0.01)
    # the second pass leaves the simulated P->D TTFT where the runs have it
    from profiler.simulator.replay_twin import simulate_twin, ttft_gap_ms

    gaps = sorted(ttft_gap_ms(run, simulate_twin(run, str(out))) for run in runs)
    assert abs(gaps[len(gaps) // 2]) < 10.0
    assert "front end settled" in text and "P->D hand-off settled" in text


def test_calibrate_reads_the_per_running_term_from_busy_rows(runs: list[Path],
                                                             tmp_path: Path, capsys) -> None:
    probe = tmp_path / "probe.csv"
    pd.concat([probe_rows(22.0, 0.03, 0.0, 2048, frontend_us=1.0).assign(running=0),
               busy_rows(0.8)]).to_csv(probe, index=False)
    out = tmp_path / "busy.json"
    assert ppd(["sim", "calibrate", *map(str, runs), "--probe", str(probe),
                "--out", str(out)]) == 0
    assert "0.80 ms/running request" in capsys.readouterr().out
    cost = load_cost(str(out))
    assert isinstance(cost, HostedCost)
    assert cost.host.frontend_per_running_ms == pytest.approx(0.8, abs=0.02)
    assert "busy-text" in cost.host.sources["frontend_per_running_ms"]
