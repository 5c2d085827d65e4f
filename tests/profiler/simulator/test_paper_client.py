"""The simulator's model of the PPD paper's benchmark client: capped connections, the TTFT
clock started when a turn is due, not when a connection frees up."""

from __future__ import annotations

import pytest

from profiler.engine import LinearCost
from profiler.engine.transfer import load_link, load_model_shape
from profiler.simulator.run import RunSpec
from profiler.simulator.virtual_cluster import SimSetup, Simulator
from profiler.simulator.workload import Arrival, SimConversation, SimTurn
from proxy.config import Policy, PolicyConfig
from proxy.policies import RoutingPolicy
from proxy.vocabulary import Layout

HAND = LinearCost("hand", "tests", base_ms=10.0, per_prefill_token_ms=0.1,
                  per_decode_seq_ms=1.0)


def _run(connections: int | None) -> list:
    setup = SimSetup(Layout.parse("2R"), HAND, RoutingPolicy(PolicyConfig(kind=Policy.REPLICA)),
                     load_link("nvlink"), load_model_shape("llama-3.1-8b").kv_bytes_per_token,
                     client_connections=connections)
    conversations = [SimConversation(f"c{i}", (SimTurn(100, 20),)) for i in range(3)]
    return Simulator(setup).run([Arrival(0.0, c) for c in conversations]).records


def test_a_capped_client_counts_the_wait_for_a_connection_in_ttft() -> None:
    ideal = sorted(_run(None), key=lambda r: r.ttft_s)
    capped = sorted(_run(1), key=lambda r: r.ttft_s)
    assert all(r.success for r in capped)
    # every turn is due at 0; with one connection the second waits for the first's whole
    # reply, the third for both - and all three clocks started at 0
    assert [r.start_s for r in capped] == [0.0, 0.0, 0.0]
    assert capped[1].ttft_s == pytest.approx(capped[0].e2e_s + capped[0].ttft_s, rel=1e-6)
    assert capped[2].ttft_s > capped[1].e2e_s
    assert max(r.ttft_s for r in ideal) < capped[1].ttft_s
    # a cap above the load changes nothing
    assert [(r.ttft_s, r.e2e_s) for r in sorted(_run(10), key=lambda r: r.ttft_s)] == \
        [(r.ttft_s, r.e2e_s) for r in ideal]


def test_connection_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RunSpec(layout="1P1D", dataset="synthetic:small-tiny", qps=1.0, client_connections=0)
