"""Emulated nodes carry their preset's modelled front end and hand-off (profiler.engine.host)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import httpx
import pytest

from profiler.emulate.presets import resolve
from profiler.emulate.serve import hosted, node_specs
from profiler.emulate.tokenizer import Vocabulary
from profiler.engine import load_cost
from proxy.shared.vocabulary import Role


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


def _with_front_end(request_ms: float, service_ms: float):  # type: ignore[no-untyped-def]
    preset = resolve("h100", "llama-3.1-8b")
    cost = preset.cost
    host = replace(cost.host, frontend_request_ms=request_ms,  # type: ignore[attr-defined]
                   frontend_per_token_us=0.0, frontend_per_running_ms=0.0,
                   frontend_service_ms=service_ms)
    return replace(preset, cost=replace(cost, host=host))  # type: ignore[type-var]


async def _burst_s(preset, vocab: Vocabulary, requests: int) -> float:  # type: ignore[no-untyped-def]
    """Seconds for `requests` /tokenize calls sent at once to one emulated node."""
    async with hosted(preset, [(Role.DECODE, 0)], vocab=vocab) as (node,), \
            httpx.AsyncClient(timeout=30) as client:
        body = {"model": "llama-3.1-8b", "prompt": "a short prompt"}
        await client.post(f"{node.url}/tokenize", json=body)  # warm: connection, tokenizer
        started = time.perf_counter()
        answers = await asyncio.gather(*(client.post(f"{node.url}/tokenize", json=body)
                                         for _ in range(requests)))
        assert all(answer.status_code == 200 for answer in answers)
        return time.perf_counter() - started


async def test_a_burst_waits_for_the_api_server_in_turn(vocab: Vocabulary) -> None:
    """vLLM's API server is one event loop (profiler.engine.frontend): the k-th of a burst
    reaches the engine after the k - 1 before it. Without a service time the front end is a
    delay all of them pay at once."""
    (spec,) = node_specs(_with_front_end(200.0, 200.0), "llama-3.1-8b", [(Role.DECODE, 0)])
    assert spec.frontend_service_s == pytest.approx(0.2)
    assert await _burst_s(_with_front_end(200.0, 200.0), vocab, 4) >= 0.8  # 4 x 200 ms
    assert await _burst_s(_with_front_end(200.0, 0.0), vocab, 4) < 0.6
