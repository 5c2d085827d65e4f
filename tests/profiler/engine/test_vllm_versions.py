"""Presets that say which vLLM they are, the vLLM 0.24 fit on real H100 data, and the two
scheduling mechanisms it models by name (the step look-ahead, the cold step)."""

from __future__ import annotations

import json

import pytest

from profiler.cli import main as ppd
from profiler.engine import BatchShape, Engine, EngineConfig, LinearCost, load_cost, measured
from profiler.engine.host import HostedCost, HostModel
from profiler.engine.idle import IdleShape, predict
from profiler.engine.requests import Request
from profiler.engine.vllm_versions import split_version

HAND = LinearCost("hand", "tests", base_ms=10.0, per_prefill_token_ms=0.1,
                  per_decode_seq_ms=1.0)


def test_version_suffix_parses_and_bad_ones_say_what_is_known() -> None:
    assert split_version("h100:llama-3.1-8b") == ("h100:llama-3.1-8b", None)
    base, version = split_version("h200:qwen3-8b:tp2@vllm-0.13")
    assert base == "h200:qwen3-8b:tp2" and version is not None and version.version == "0.13"
    with pytest.raises(ValueError, match="unknown vLLM version '0.99'.*@vllm-0.24"):
        split_version("h100:llama-3.1-8b@vllm-0.99")
    with pytest.raises(ValueError, match="written @vllm-X.Y"):
        split_version("h100:llama-3.1-8b@0.13")
    with pytest.raises(ValueError, match="no vLLM host side"):
        load_cost("h100:llama-3.1-8b@vllm-0.13:kernels")


def test_default_is_vllm_024_and_013_is_the_papers_engine(h100) -> None:
    default = load_cost("h100:llama-3.1-8b")
    explicit = load_cost("h100:llama-3.1-8b@vllm-0.24")
    paper = load_cost("h100:llama-3.1-8b@vllm-0.13")
    assert isinstance(default, HostedCost) and isinstance(paper, HostedCost)
    assert (default.vllm, paper.vllm) == ("0.24", "0.13")
    assert default.host == explicit.host and "vLLM 0.24" in default.source
    # 0.24 schedules ahead and pays the cold step; the paper's 0.13 fit is synchronous
    assert default.host.schedules_ahead and default.host.cold_step_host_ms > 0
    assert not paper.host.schedules_ahead and paper.host.cold_step_host_ms == 0
    decode = measured.decode_shape(100)
    assert default.step_ms(decode) < paper.step_ms(decode)  # the newer engine is faster
    # the version applies to every GPU preset, with the model's own layer count
    other = load_cost("h200:llama-3.1-70b:tp2@vllm-0.13")
    assert isinstance(other, HostedCost) and other.vllm == "0.13"
    assert other.host.descriptors_per_block == 160


def test_vllm_024_fit_reproduces_its_data(h100) -> None:
    data = measured.default_measurements()
    host = measured.fit_host(h100, data)
    cost = HostedCost("h", h100, host)
    for batch, row in data.decode_means().items():
        if batch <= 100:  # in sample: decode TPOT within 8%
            step = cost.step_ms(host.graph_shape(measured.decode_shape(batch)))
            assert step == pytest.approx(row.tpot_ms, rel=0.08), batch
    for tokens, row in data.fresh_medians().items():
        if tokens >= 2048:  # long prompts: one step's kernels + the cold step within 10%
            shape = BatchShape(1, tokens, 0, 0, 0)
            modelled = cost.step_ms(shape) + host.cold_step_ms(shape)
            assert modelled == pytest.approx(row.prefill_ms, rel=0.10), tokens
    assert 3 < host.frontend_request_ms < 8 and 4 < host.cold_step_host_ms < 10
    assert {"frontend_request_ms", "cold_step_host_ms", "schedules_ahead",
            "step_base_ms"} <= set(host.sources)


def test_fit_reads_a_file_and_rejects_a_bad_one(tmp_path, h100) -> None:
    raw = json.loads(measured.DATA.read_text())
    # fitting on a subset leaves the rest out of sample; too small a subset is refused
    half = measured.fit_host(h100, measured.read(measured.DATA), lengths=(128, 4096),
                             batches=(1, 100))
    assert half.cold_step_host_ms > 0
    with pytest.raises(ValueError, match="at least two"):
        measured.fit_host(h100, lengths=(128,))
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps({"phases": {"A_fresh_ttft": raw["phases"]["A_fresh_ttft"]}}))
    with pytest.raises(ValueError, match="phases A and C"):
        measured.read(bad)


def _engine(host: HostModel) -> Engine:
    return Engine(EngineConfig(), HostedCost("h", HAND, host))


def test_a_request_arriving_mid_step_waits_for_the_step_already_scheduled() -> None:
    ahead, sync = _engine(HostModel(schedules_ahead=True)), _engine(HostModel())
    for engine in (ahead, sync):
        engine.submit(Request("a", max_tokens=10, prompt_token_ids=list(range(100))), now=0.0)
        first = engine.step(0.0)  # prefill: 10 + 10 ms
        engine.submit(Request("b", max_tokens=2, prompt_token_ids=list(range(500, 520))),
                      now=first.start + 0.005)
        second = engine.step(first.end)
        third = engine.step(second.end)
        assert "a" in second.tokens
        if engine is ahead:  # step 2 was planned when step 1 started: b joins step 3
            assert "b" not in second.tokens and "b" in third.tokens
        else:
            assert "b" in second.tokens


def test_the_look_ahead_never_idles_the_engine_and_the_cold_step_is_paid_once() -> None:
    engine = _engine(HostModel(schedules_ahead=True, cold_step_host_ms=7.0))
    engine.submit(Request("a", max_tokens=2, prompt_token_ids=list(range(100))), now=0.0)
    first = engine.step(0.0)
    assert first.duration == pytest.approx(0.020 + 0.007)  # cold: nothing ran before
    engine.submit(Request("b", max_tokens=2, prompt_token_ids=list(range(300, 400))),
                  now=first.start + 0.001)
    second = engine.step(first.end)  # warm: no cold cost; a decodes, b waits a step
    assert second.duration == pytest.approx(0.011) and "b" not in second.tokens
    third = engine.step(second.end)  # a is done: b runs now although it came late
    assert "b" in third.tokens
    assert third.duration == pytest.approx(0.020)


def test_idle_prediction_matches_the_measured_shape(h100) -> None:
    cost = load_cost("h100:llama-3.1-8b")
    # phase C at batch 1: 2,048 cached + 32 new tokens, 64 outputs: 21.6 / 20.0 ms TTFT and
    # 6.5 / 6.8 ms TPOT measured (in sample)
    one = predict(cost, IdleShape(prompt=2080, cached=2048, max_tokens=64))
    assert one.ttft_ms == pytest.approx(20.8, rel=0.15)
    assert one.tpot_ms == pytest.approx(6.64, rel=0.10)
    # a cached history makes it cheaper than the whole prompt fresh
    fresh = predict(cost, IdleShape(prompt=2080, max_tokens=64))
    assert fresh.ttft_ms > one.ttft_ms + 20
    # requests decoding beside it: theirs is the TPOT, and a 1k prefill costs them some
    busy = predict(cost, IdleShape(prompt=1024, decoding=30, context=2048, max_tokens=32))
    alone = predict(cost, IdleShape(prompt=2, cached=1, decoding=30, context=2048,
                                    max_tokens=32))
    assert busy.tpot_ms > alone.tpot_ms and busy.ttft_ms > one.ttft_ms


def test_sim_idle_prints_one_line_and_explains_bad_input(capsys) -> None:
    assert ppd(["sim", "idle", "--preset", "h100:llama-3.1-8b", "--prompt", "128"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("ttft_ms=") and " tpot_ms=" in out[0]
    ttft = float(out[0].split()[0].split("=")[1])
    assert 10 < ttft < 30  # measured 18.5 ms
    for args, message in ((["--prompt", "10", "--cached", "10"], "--cached must be"),
                          (["--prompt", "10", "--decoding", "4"], "--decoding needs --context"),
                          (["--prompt", "10", "--context", "4"], "--context needs --decoding"),
                          (["--prompt", "10", "--max-tokens", "1"], "at least 2"),
                          (["--prompt", "0"], "at least 1"),
                          (["--prompt", "10", "--decoding", "900", "--context", "8"],
                           "max_num_seqs")):
        assert ppd(["sim", "idle", "--preset", "h100:llama-3.1-8b", *args]) == 1
        assert message in capsys.readouterr().err
    assert ppd(["sim", "idle", "--preset", "h100:llama-3.1-8b@vllm-9", "--prompt", "9"]) == 1
    assert "unknown vLLM version" in capsys.readouterr().err



def test_sim_idle_says_so_when_the_batch_does_not_fit_the_kv_cache(capsys) -> None:
    """200 requests of 2,144 tokens plus the outputs that carry them through the measurement
    need more blocks than the preset's H100 cache (27,062 at vLLM's 0.9): some are preempted
    or finish before the request arrives. That used to end in an IndexError; now the TPOT is
    the decoding ones' and a note on stderr says how many were not decoding, and why."""
    assert ppd(["sim", "idle", "--preset", "h100:llama-3.1-8b", "--prompt", "1024",
                "--decoding", "200", "--context", "2144"]) == 0
    captured = capsys.readouterr()
    line = captured.out.strip().splitlines()
    assert len(line) == 1 and line[0].startswith("ttft_ms=")
    assert float(line[0].split("tpot_ms=")[1]) > 0
    assert "of the 200 decoding requests" in captured.err
    assert "KV cache (27,062 blocks of 16 tokens)" in captured.err
    assert "Lower --decoding or --context" in captured.err
    # a batch that fits says nothing
    fits = predict(load_cost("h100:llama-3.1-8b"),
                   IdleShape(prompt=1024, decoding=200, context=2080))
    assert fits.not_decoding == 0 and fits.warning(IdleShape(1024, 0, 200, 2080)) is None

def test_presets_list_each_version_and_its_sources(capsys) -> None:
    assert ppd(["sim", "presets"]) == 0
    out = capsys.readouterr().out
    assert "@vllm-0.24 (default)" in out and "@vllm-0.13" in out
    assert "h100:llama-3.1-8b@vllm-0.13" in out and "measured.json" in out
