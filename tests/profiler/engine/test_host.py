"""vLLM's host side in the engine model: each term alone, the presets built from public
numbers, and the simulator paying the per-request terms where vLLM pays them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from profiler.engine import BatchShape, LinearCost, load_cost, public
from profiler.engine.host import HostedCost, HostModel, host_of, vllm_capture_sizes
from profiler.engine.presets import from_dict, register, to_dict
from profiler.engine.transfer import SharedLink, load_link, load_model_shape
from profiler.simulator.virtual_cluster import SimSetup, Simulator
from profiler.simulator.workload import Arrival, SimConversation, SimTurn
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.policies.routing import RoutingPolicy
from proxy.shared.vocabulary import Layout

HAND = LinearCost("hand", "tests", base_ms=10.0, per_prefill_token_ms=0.1,
                  per_decode_seq_ms=1.0)


def test_capture_sizes_are_vllms_ladder() -> None:
    sizes = vllm_capture_sizes(256)
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[-3:] == (480, 496, 512)
    assert 248 in sizes and 256 in sizes and 264 not in sizes and 272 in sizes
    assert vllm_capture_sizes(8)[-1] == 16  # min(2 x max_num_seqs, 512)


def test_decode_only_steps_are_padded_to_a_captured_size_mixed_steps_are_not() -> None:
    host = HostModel(cuda_graph_sizes=vllm_capture_sizes(256))
    assert host.graph_shape(BatchShape(0, 0, 0, 10, 1000)).num_decode_requests == 16
    assert host.graph_shape(BatchShape(0, 0, 0, 16, 1000)).num_decode_requests == 16
    # the padded slots attend to nothing: the context is the real requests'
    assert host.graph_shape(BatchShape(0, 0, 0, 10, 1000)).sum_decode_kv_tokens == 1000
    mixed = BatchShape(1, 100, 0, 10, 1000)
    assert host.graph_shape(mixed) == mixed
    assert host.graph_shape(BatchShape(0, 0, 0, 600, 9000)).num_decode_requests == 600
    cost = HostedCost("g", HAND, host)
    assert cost.step_ms(BatchShape(0, 0, 0, 10, 1000)) == pytest.approx(10 + 16 * 1.0)


def test_step_host_time_and_async_overlap() -> None:
    sync = HostModel(step_base_ms=2.0, step_per_request_ms=0.5, step_per_token_ms=0.01)
    shape = BatchShape(1, 100, 0, 4, 400)  # 5 requests, 104 tokens
    assert sync.step_host_ms(shape) == pytest.approx(2.0 + 2.5 + 1.04)
    assert HostedCost("s", HAND, sync).step_ms(shape) == pytest.approx(
        HAND.step_ms(shape) + 5.54)
    overlapped = HostModel(step_base_ms=2.0, step_per_request_ms=0.5, step_per_token_ms=0.01,
                           async_scheduling=True, async_residual_ms=0.3)
    # host 5.54 ms < kernels 24 ms: hidden behind the GPU but for the residual
    assert HostedCost("a", HAND, overlapped).step_ms(shape) == pytest.approx(
        HAND.step_ms(shape) + 0.3)
    assert overlapped.exposed_host_ms(shape, kernel_ms=5.0) == pytest.approx(0.54 + 0.3)
    assert sync.step_host_ms(BatchShape()) == 0.0
    with pytest.raises(ValueError, match="must be >= 0"):
        HostModel(step_base_ms=-1.0)


def test_handoff_cost_counts_descriptors_per_block() -> None:
    host = HostModel(kv_handoff_ms=1.0, kv_descriptor_us=4.0, descriptors_per_block=64)
    # 1000 tokens = 63 blocks of 16 -> 4032 descriptors x 4 us = 16.128 ms, + 1 ms
    assert host.handoff_s(1000, 16) == pytest.approx(0.017128)
    link = SharedLink(load_link("nvlink"))
    link.start("t", 0.0, now=0.0, setup_s=0.02)
    assert link.next_completion() == pytest.approx(0.02 + 5e-6)


def test_hosted_preset_round_trips_through_json(tmp_path) -> None:
    host = HostModel(frontend_request_ms=3.0, step_base_ms=1.5, cuda_graph_sizes=(1, 2, 4),
                     sources={"frontend_request_ms": "a test"})
    cost = HostedCost("cpu", HAND, host, source="fit", engine={"block_size": 128})
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(to_dict(cost)))
    again = load_cost(str(path))
    assert isinstance(again, HostedCost)
    assert again.host == host and again.host.sources == host.sources
    assert again.engine == {"block_size": 128} and again.kernel == HAND
    with pytest.raises(ValueError, match="unknown host keys"):
        from_dict({"kind": "hosted", "name": "x", "kernel": HAND.to_dict(),
                   "host": {"nope": 1}})
    with pytest.raises(ValueError, match="unknown cost preset kind"):
        from_dict({"kind": "quantum"})
    register("my-calibrated", lambda: cost)
    assert load_cost("my-calibrated") is cost
    assert HAND.kv_blocks(16, 8192, 256) is None


def test_default_h100_preset_is_kernels_plus_host_and_kernels_stay_selectable(h100) -> None:
    hosted = load_cost("h100:llama-3.1-8b")
    kernels = load_cost("h100:llama-3.1-8b:kernels")
    assert isinstance(hosted, HostedCost) and not isinstance(kernels, HostedCost)
    assert host_of(kernels) == HostModel()
    shape = BatchShape(0, 0, 0, 32, 32 * 2048)
    assert kernels.step_ms(shape) == pytest.approx(h100.step_ms(shape))
    assert hosted.step_ms(shape) > kernels.step_ms(shape)
    host = hosted.host
    # every term names where it comes from
    assert {"frontend_request_ms", "step_base_ms", "step_per_request_ms", "cuda_graph_sizes",
            "kv_descriptor_us"} <= set(host.sources)
    assert host.descriptors_per_block == 64  # 2 x 32 layers
    assert load_cost("h100:llama-3.1-70b").host.descriptors_per_block == 160
    assert hosted.kv_blocks() == pytest.approx(27062, rel=0.01)


def test_h100_host_terms_fit_their_source_and_are_derived_not_typed(h100) -> None:
    host = public.h100_host(h100)
    # In sample: the five decode-only TPOTs of the PPD micro-benchmark within 6%.
    cost = HostedCost("h", h100, host)
    for row in public.PPD_MICROBENCHMARK:
        predicted = cost.step_ms(public.micro_decode_shape(row.batch))
        assert predicted == pytest.approx(row.decode_only_ms, rel=0.06), row
    # The front end is what is left of inference-sim's TTFT after the kernels and one step's
    # host time: tens of ms, the same order as the gap it explains.
    assert 15 < host.frontend_request_ms < 30
    assert host.kv_descriptor_us == pytest.approx(6.7 * 1000 / 1785, rel=1e-3)


def _setup(cost, policy: Policy) -> SimSetup:
    return SimSetup(Layout.parse("1P1D"), cost, RoutingPolicy(PolicyConfig(kind=policy)),
                    load_link("nvlink"), load_model_shape("llama-3.1-8b").kv_bytes_per_token)


def test_simulator_pays_the_front_end_per_node_request_and_the_handoff_per_transfer() -> None:
    conversation = SimConversation("c", (SimTurn(100, 3), SimTurn(50, 2)))
    bare = Simulator(_setup(HAND, Policy.LOCAL)).run([Arrival(0.0, conversation)]).records
    host = HostModel(frontend_request_ms=7.0, frontend_finish_ms=2.0, kv_handoff_ms=3.0)
    hosted = Simulator(_setup(HostedCost("h", HAND, host), Policy.LOCAL)).run(
        [Arrival(0.0, conversation)]).records
    # Turn 1 is P->D: P's front end, then D's, then the hand-off: 7 + 7 + 3 ms more.
    assert hosted[0].ttft_s == pytest.approx(bare[0].ttft_s + 0.017, abs=1e-9)
    # The end of the stream costs 2 ms once, so the next turn starts 2 ms later than
    # the front-end-shifted end.
    assert hosted[0].e2e_s == pytest.approx(bare[0].e2e_s + 0.017 + 0.002, abs=1e-9)
    assert hosted[1].start_s == pytest.approx(hosted[0].start_s + hosted[0].e2e_s)
    # Turn 2 is local on D: one front end.
    assert hosted[1].ttft_s == pytest.approx(bare[1].ttft_s + 0.007, abs=1e-9)


def test_simulator_queues_simultaneous_requests_at_a_nodes_api_server() -> None:
    # Two conversations whose turn 1 reaches the same R at the same instant: with a service
    # time the second waits for the first at the API server (profiler/engine/frontend.py).
    conversations = [SimConversation(f"c{i}", (SimTurn(100, 3),)) for i in range(2)]
    setup = SimSetup(Layout.parse("1R"), HostedCost("h", HAND, HostModel(
        frontend_request_ms=7.0, frontend_service_ms=3.0)),
        RoutingPolicy(PolicyConfig(kind=Policy.REPLICA)), load_link("nvlink"),
        load_model_shape("llama-3.1-8b").kv_bytes_per_token)
    records = Simulator(setup).run([Arrival(0.0, c) for c in conversations]).records
    delay = HostedCost("h", HAND, HostModel(frontend_request_ms=7.0))
    plain = Simulator(replace(setup, cost=delay)).run(
        [Arrival(0.0, c) for c in conversations]).records
    first, second = sorted(r.ttft_s for r in records)
    plain_first, _ = sorted(r.ttft_s for r in plain)
    assert first == pytest.approx(plain_first, abs=1e-9)  # the first is served at once
    assert second >= first + 0.003 - 1e-9  # the second waited its 3 ms turn
