"""Emulated nodes carry their preset's modelled front end and hand-off (profiler.engine.host)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from profiler.emulate.host import node_specs
from profiler.emulate.presets import resolve
from profiler.engine import load_cost
from proxy.vocabulary import Role


def test_gpu_preset_nodes_sleep_the_modelled_front_end_and_handoff() -> None:
    preset = resolve("h100", "llama-3.1-8b")
    host = preset.cost.host  # type: ignore[attr-defined]
    prefill, decode = node_specs(preset, "llama-3.1-8b", [(Role.PREFILL, 0), (Role.DECODE, 0)])
    assert decode.frontend_request_s == pytest.approx(host.frontend_request_ms / 1000)
    # milliseconds: vLLM 0.24's API server and its client, as fitted on the real H100
    assert 0.003 < decode.frontend_request_s < 0.01
    # NIXL: 64 descriptors per 16-token block at ~3.75 us each, per token
    assert decode.handoff_per_token_s == pytest.approx(
        host.kv_descriptor_us * host.descriptors_per_block / 16 / 1e6)
    assert prefill.handoff_fixed_s == decode.handoff_fixed_s == 0.0


def test_kernels_only_and_linear_nodes_add_nothing() -> None:
    kernels = replace(resolve("h100", "llama-3.1-8b"),
                      cost=load_cost("h100:llama-3.1-8b:kernels"))
    for preset in (kernels, resolve("linear", "llama-3.1-8b")):
        (spec,) = node_specs(preset, "llama-3.1-8b", [(Role.DECODE, 0)])
        assert spec.frontend_request_s == 0.0
        assert spec.handoff_fixed_s == spec.handoff_per_token_s == 0.0


def test_nodes_of_a_preset_fitted_at_the_client_sleep_only_the_node_part() -> None:
    preset = resolve("h100", "llama-3.1-8b")
    cost = preset.cost
    host = replace(cost.host, frontend_node_ms=4.0,  # type: ignore[attr-defined]
                   frontend_node_per_token_us=1.0, frontend_per_token_us=3.0)
    fitted = replace(preset, cost=replace(cost, host=host))  # type: ignore[type-var]
    (spec,) = node_specs(fitted, "llama-3.1-8b", [(Role.DECODE, 0)])
    # the proxy and the client in front of an emulated node pay the rest for real
    assert spec.frontend_request_s == pytest.approx(0.004)
    assert spec.frontend_per_token_s == pytest.approx(1.0e-6)
