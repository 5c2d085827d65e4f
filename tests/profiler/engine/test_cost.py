from __future__ import annotations

import json
import pickle

import pytest

from profiler.engine import BatchShape, LinearCost, load_cost
from profiler.engine.aic import _bucket, load_preset


# The reference numbers of issue #12 (aiconfigurator-core 0.12, h100_sxm, vllm 0.24.0, bf16).
@pytest.mark.parametrize(("shape", "expected_ms"), [
    (BatchShape(1, 2048), 43.5),  # a 2048-token prefill
    (BatchShape(0, 0, 0, 32, 32 * 2048), 9.6),  # a 32-request decode step at 2k context
    (BatchShape(1, 256, 0, 32, 32 * 2048), 12.7),  # ... with 256 prompt tokens mixed in
    (BatchShape(1, 8192, 0, 32, 32 * 2048), 204.0),  # ... with 8192
])
def test_h100_preset_reproduces_the_reference_numbers(h100, shape, expected_ms):
    assert h100.step_ms(shape) == pytest.approx(expected_ms, rel=0.02)


def test_kv_capacity_from_the_memory_model(h100):
    # 80 GiB x 0.9 less weights and activations, at 128 KiB per token: ~433k tokens
    assert h100.kv_blocks() == pytest.approx(27062, rel=0.01)


def test_aic_results_are_cached_by_bucket(h100):
    calls = h100.calls
    first = h100.step_ms(BatchShape(0, 0, 0, 31, 65500))
    assert h100.calls == calls + 1
    assert h100.step_ms(BatchShape(0, 0, 0, 31, 65100)) == first  # same bucket
    assert h100.calls == calls + 1
    assert h100.step_ms(BatchShape()) == 0.0
    # More context costs more; the bucketed answer is within 1% of the exact one.
    exact = h100.step_ms_uncached(BatchShape(0, 0, 0, 31, 65100))
    assert first == pytest.approx(exact, rel=0.01)
    assert h100.step_ms(BatchShape(0, 0, 0, 31, 4 * 65500)) > first


def test_a_preset_pickles_for_worker_processes(h100):
    h100.step_ms(BatchShape(1, 2048))
    copy = pickle.loads(pickle.dumps(h100))
    assert copy._perf is None and copy._cache == h100._cache
    assert copy.step_ms_uncached(BatchShape(1, 512)) == h100.step_ms_uncached(BatchShape(1, 512))


def test_bucket_keeps_small_values_and_six_significant_bits():
    assert [_bucket(v) for v in (0, 63, 64, 100, 2048, 2049, 70000)] == [
        0, 63, 64, 100, 2048, 2048, 69632]
    for value in range(64, 200_000, 997):
        assert abs(_bucket(value) - value) <= value / 64


def test_preset_names_are_validated():
    assert load_preset("h200:llama-3.1-70b:tp4").tp_size == 4
    assert "h100_sxm" in load_preset("h100:llama-3.1-8b").source
    for bad in ("h100", "a100:llama-3.1-8b", "h100:gpt-5", "h100:llama-3.1-8b:x2"):
        with pytest.raises(ValueError, match="preset"):
            load_preset(bad)


def test_linear_cost_by_hand_and_as_json(tmp_path):
    cost = LinearCost("cpu", "fit", base_ms=5.0, per_prefill_token_ms=0.5,
                      per_decode_seq_ms=2.0, per_decode_kv_ktoken_ms=1.0,
                      per_prefill_attention_ms=0.1)
    # 5 + 0.5*100 + 0.1*100*(200 + 50)/1000 + 2*3 + 1*3000/1000
    assert cost.step_ms(BatchShape(1, 100, 200, 3, 3000)) == pytest.approx(5 + 50 + 2.5 + 6 + 3)
    assert cost.step_ms(BatchShape()) == 0.0
    path = tmp_path / "cpu.json"
    path.write_text(cost.to_json())
    assert load_cost(str(path)) == cost
    path.write_text(json.dumps({**json.loads(cost.to_json()), "typo_ms": 1}))
    with pytest.raises(ValueError, match="typo_ms"):
        load_cost(str(path))
    with pytest.raises(ValueError, match="not found"):
        load_cost(str(tmp_path / "missing.json"))
