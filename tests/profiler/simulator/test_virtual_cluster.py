"""The cluster simulator on hand-computed cases, determinism, timeouts, and the proxy's code."""

from __future__ import annotations

import pytest

import proxy.policies.fixed
from profiler.engine import LinearCost
from profiler.engine.transfer import SharedLink, load_link, load_model_shape
from profiler.simulator.virtual_cluster import SimSetup, Simulator
from profiler.simulator.workload import Arrival, SimConversation, SimTurn
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.policies.routing import RoutingPolicy
from proxy.shared.vocabulary import Layout

LLAMA_KV = load_model_shape("llama-3.1-8b").kv_bytes_per_token
NVLINK = load_link("nvlink")


def _setup(cost: LinearCost, layout: str = "1P1D", timeout_s: float = 30.0,
           **policy: object) -> SimSetup:
    config = PolicyConfig(**policy) if policy else PolicyConfig(kind=Policy.PD)  # type: ignore[arg-type]
    return SimSetup(Layout.parse(layout), cost, RoutingPolicy(config), NVLINK, LLAMA_KV,
                    timeout_s=timeout_s)


def _conversation(cid: str, *turns: tuple[int, int]) -> SimConversation:
    return SimConversation(cid, tuple(SimTurn(n, out) for n, out in turns))


def test_one_p_to_d_turn_then_a_local_turn_by_hand(hand_cost: LinearCost) -> None:
    conv = _conversation("c", (100, 3), (50, 2))
    result = Simulator(_setup(hand_cost, kind=Policy.LOCAL)).run([Arrival(0.0, conv)])
    first, second = result.records
    # Turn 1: P prefills 100 tokens (10 + 10 ms); D takes the request and pulls 100 tokens'
    # KV over NVLink (5 us + 100 * 128 KiB / 450 GB/s); then one step recomputes the last
    # prompt token and samples (10 + 1 ms), and two decode steps follow (11 ms each).
    transfer = 5e-6 + 100 * LLAMA_KV / 450e9
    assert first.route == "pd" and first.success
    assert first.ttft_s == pytest.approx(0.020 + transfer + 0.011, abs=1e-9)
    assert first.tpot_s == pytest.approx(0.011, abs=1e-9)
    # Turn 2, local on the same D: it holds 102 computed tokens (the last output is sampled,
    # not yet fed back) = 6 full blocks of 16; 153 - 96 = 57 tokens to prefill: 10 + 5.7 ms.
    assert second.route == "local" and second.decode == first.decode
    assert second.start_s == pytest.approx(first.start_s + first.e2e_s)
    assert second.ttft_s == pytest.approx(0.0157, abs=1e-9)
    assert second.n_input_tokens == 153
    assert result.kv_bytes_moved == 100 * LLAMA_KV


def test_p_to_d_on_turn_two_pulls_only_what_d_does_not_cache(hand_cost: LinearCost) -> None:
    conv = _conversation("c", (100, 3), (50, 2))
    result = Simulator(_setup(hand_cost)).run([Arrival(0.0, conv)])
    assert [r.route for r in result.records] == ["pd", "pd"]
    # D caches 96 of turn 2's 153 prompt tokens from turn 1; it pulls the other 57.
    assert result.kv_bytes_moved == (100 + 57) * LLAMA_KV


def test_same_seed_same_records_and_every_turn_accounted(hand_cost: LinearCost) -> None:
    conversations = [_conversation(f"c{i}", (200 + 10 * i, 20), (30, 40), (60, 10))
                     for i in range(12)]
    arrivals = [Arrival(0.05 * i, c) for i, c in enumerate(conversations)]

    def run() -> list[object]:
        return Simulator(_setup(hand_cost, "1P2D", kind=Policy.FIXED, x=0.5)).run(
            arrivals).records

    first, again = run(), run()
    assert first == again
    assert len(first) == 36 and all(r.success for r in first)
    assert {r.route for r in first if r.turn >= 2} == {"pd", "local"}


def test_a_turn_past_the_timeout_fails_and_ends_its_conversation(hand_cost: LinearCost) -> None:
    # 2000 output tokens at ~11 ms each take ~22 s: past a 5 s timeout.
    conv = _conversation("c", (100, 2000), (10, 10))
    other = _conversation("d", (100, 5), (10, 5))
    result = Simulator(_setup(hand_cost, timeout_s=5.0)).run(
        [Arrival(0.0, conv), Arrival(0.1, other)])
    failed = [r for r in result.records if not r.success]
    assert len(failed) == 1 and failed[0].conversation_id == "c"
    assert failed[0].error == "timeout after 5 s" and failed[0].e2e_s == pytest.approx(5.0)
    assert [r.turn for r in result.records if r.conversation_id == "c"] == [1]
    assert sum(r.success for r in result.records) == 2


def test_replica_layout_serves_every_turn_on_one_node(hand_cost: LinearCost) -> None:
    conv = _conversation("c", (100, 3), (50, 2))
    result = Simulator(_setup(hand_cost, "2R", kind=Policy.REPLICA)).run([Arrival(0.0, conv)])
    assert [r.route for r in result.records] == ["replica", "replica"]
    assert len({r.decode for r in result.records}) == 1
    assert result.kv_bytes_moved == 0


def test_a_policy_change_in_proxy_policies_changes_the_simulated_routes(
        hand_cost: LinearCost, monkeypatch: pytest.MonkeyPatch) -> None:
    conversations = [_conversation(f"c{i}", (100, 5), (20, 5)) for i in range(20)]
    arrivals = [Arrival(0.01 * i, c) for i, c in enumerate(conversations)]

    def local_share() -> float:
        records = Simulator(_setup(hand_cost, kind=Policy.FIXED, x=0.5)).run(arrivals).records
        later = [r for r in records if r.turn == 2]
        return sum(r.route == "local" for r in later) / len(later)

    assert 0.0 < local_share() < 1.0
    # The fixed policy's draw lives in proxy.policies; the simulator runs that very code.
    monkeypatch.setattr(proxy.policies.fixed, "stable_fraction", lambda session, turn: 0.0)
    assert local_share() == 1.0
    monkeypatch.setattr(proxy.policies.fixed, "stable_fraction", lambda session, turn: 0.99)
    assert local_share() == 0.0


def test_a_prompt_too_long_for_the_model_fails_like_a_400(hand_cost: LinearCost) -> None:
    conv = _conversation("c", (200_000, 10))
    result = Simulator(_setup(hand_cost)).run([Arrival(0.0, conv)])
    (record,) = result.records
    assert not record.success and record.status == 400 and "max_model_len" in str(record.error)


def test_a_link_transfer_late_in_a_run_completes() -> None:
    # Regression: a 1e-6-byte tolerance is below a float's time resolution at t = 5 s; the
    # link's advance() then looped forever on a transfer with a few bytes' float error left.
    link = SharedLink(NVLINK)
    link.start("a", 57 * LLAMA_KV, 5.123456789)
    link.start("b", 1234 * LLAMA_KV, 5.1234568)
    due = link.next_completion()
    assert due is not None
    assert link.advance(due) == ["a"]
    assert link.advance(link.next_completion() or 0.0) == ["b"]


@pytest.mark.parametrize(("layout", "kind"), [("2R", Policy.REPLICA), ("1P1D", Policy.PD)])
def test_a_timeout_during_a_requests_last_step_fails_the_turn(
        hand_cost: LinearCost, layout: str, kind: Policy) -> None:
    # The first step (P's or the replica's prefill of 100 tokens, which samples the one token
    # asked for) runs 0-20 ms; the 15 ms timeout aborts and forgets the request while that
    # step is in flight, and the step's end must not find it again (it raised KeyError).
    conv = _conversation("c", (100, 1), (10, 5))
    result = Simulator(_setup(hand_cost, layout, timeout_s=0.015, kind=kind)).run(
        [Arrival(0.0, conv)])
    (record,) = result.records
    assert not record.success and record.error == "timeout after 0.015 s"


def test_a_request_waits_in_the_front_end_per_request_its_node_runs(
        hand_cost: LinearCost) -> None:
    from profiler.engine.host import HostedCost, HostModel

    def second_ttft(per_running_ms: float) -> float:
        cost = HostedCost("busy", hand_cost, HostModel(frontend_request_ms=2.0,
                                                       frontend_per_running_ms=per_running_ms))
        long = _conversation("long", (100, 200))
        late = _conversation("late", (100, 3))
        records = Simulator(_setup(cost, "1R", kind=Policy.REPLICA)).run(  # type: ignore[arg-type]
            [Arrival(0.0, long), Arrival(0.5, late)]).records
        return next(r.ttft_s for r in records if r.conversation_id == "late")

    # The late turn arrives while the long one decodes: one running request, so its front
    # end takes 11 ms more - one decode step (10 ms + 1 ms per request), so that it meets
    # the steps at the same point and the TTFT grows by exactly that.
    assert second_ttft(11.0) - second_ttft(0.0) == pytest.approx(0.011, abs=1e-9)
    assert second_ttft(0.0) < second_ttft(5.0) <= second_ttft(11.0)  # (it waits for a step)


def _readback_setup(cost: LinearCost, **kw: object) -> SimSetup:
    from dataclasses import replace

    from proxy.shared.vocabulary import RouteKind

    # Under a policy that reads back (D keeps nothing for another); the forced route rules.
    return replace(_setup(cost, kind=Policy.READBACK),
                   forced=lambda turn: RouteKind.READBACK if turn >= 2 else None, **kw)


def test_a_readback_turn_moves_the_history_d_to_p_then_p_computes_the_rest(
        hand_cost: LinearCost) -> None:
    conv = _conversation("c", (100, 3), (50, 2))
    result = Simulator(_readback_setup(hand_cost)).run([Arrival(0.0, conv)])
    first, second = result.records
    assert (first.route, second.route) == ("pd", "readback")
    # D keeps the prompt and 2 of the 3 outputs (102 ids); they open turn 2's 153-token
    # prompt. P caches 96 of them (turn 1's 6 full blocks): 6 tokens move D->P; P computes
    # the other 51 (10 + 5.1 ms); D, which caches 96, pulls 57; then D's one-token step.
    to_p = 5e-6 + 6 * LLAMA_KV / 450e9
    to_d = 5e-6 + 57 * LLAMA_KV / 450e9
    assert second.ttft_s == pytest.approx(to_p + 0.0151 + to_d + 0.011, abs=1e-9)
    assert result.kv_bytes_moved == (100 + 6 + 57) * LLAMA_KV


def test_readback_without_blocks_to_read_runs_pd(hand_cost: LinearCost) -> None:
    conv = _conversation("c", (100, 3), (50, 2))
    off = Simulator(_readback_setup(hand_cost, readback_ttl_s=None)).run([Arrival(0.0, conv)])
    assert [r.route for r in off.records] == ["pd", "pd"]
    # The tiny CPU model's replies re-tokenize into other ids: only the 100-token prompt
    # matches, still enough to read back.
    retok = Simulator(_readback_setup(hand_cost, reply_retokenized=True)).run(
        [Arrival(0.0, _conversation("c", (100, 3), (50, 2)))])
    assert [r.route for r in retok.records] == ["pd", "readback"]
    short = Simulator(_readback_setup(hand_cost, reply_retokenized=True)).run(
        [Arrival(0.0, _conversation("c", (40, 3), (50, 2)))])
    assert [r.route for r in short.records] == ["pd", "pd"]  # 40 < 64 tokens match
