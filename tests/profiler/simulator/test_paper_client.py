"""The simulator's model of the PPD paper's benchmark client: capped connections, the TTFT
clock started when a turn is due, not when a connection frees up."""

from __future__ import annotations

from dataclasses import replace

import pytest

from profiler.engine import LinearCost
from profiler.engine.transfer import load_link, load_model_shape
from profiler.simulator.run import RunSpec, arrival_seed
from profiler.simulator.virtual_cluster import SimSetup, Simulator
from profiler.simulator.workload import Arrival, SimConversation, SimTurn
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.policies.routing import RoutingPolicy
from proxy.shared.vocabulary import Layout

HAND = LinearCost("hand", "tests", base_ms=10.0, per_prefill_token_ms=0.1,
                  per_decode_seq_ms=1.0)


def _run(connections: int | None, timeout_s: float = 30.0, turns: int = 1) -> list:
    setup = SimSetup(Layout.parse("2R"), HAND, RoutingPolicy(PolicyConfig(kind=Policy.REPLICA)),
                     load_link("nvlink"), load_model_shape("llama-3.1-8b").kv_bytes_per_token,
                     client_connections=connections, timeout_s=timeout_s)
    conversations = [SimConversation(f"c{i}", (SimTurn(100, 20),) * turns) for i in range(3)]
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


def test_a_capped_clients_timeout_counts_the_wait_for_a_connection() -> None:
    """aiohttp's `total` timeout (the paper's script) covers waiting for a pool connection:
    a turn still waiting at its deadline is never sent, fails, and ends its conversation."""
    capped = sorted(_run(1), key=lambda r: r.e2e_s)
    one_reply = capped[0].e2e_s
    timeout = 1.5 * one_reply  # the second turn waits one reply and fits; the third does not
    records = _run(1, timeout_s=timeout, turns=2)
    unsent = [r for r in records if r.route is None]
    assert unsent and all(not r.success and "waiting for a connection" in (r.error or "")
                          for r in unsent)
    assert all(r.e2e_s == pytest.approx(timeout) for r in unsent)
    assert all(r.e2e_s <= timeout + 1e-9 for r in records)  # no turn outlives its deadline
    for record in unsent:  # its conversation ends there: no later turn of it was sent
        assert not [r for r in records
                    if r.conversation_id == record.conversation_id and r.turn > record.turn]
    # the ideal client (no cap) sends every turn when due: the same timeout fails none
    assert all(r.success for r in _run(None, timeout_s=timeout, turns=2))


def test_connection_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RunSpec(layout="1P1D", dataset="synthetic:small-tiny", qps=1.0, client_connections=0)


def _turn2_ttft(kept_reply) -> float:
    setup = SimSetup(Layout.parse("2R"), HAND, RoutingPolicy(PolicyConfig(kind=Policy.REPLICA)),
                     load_link("nvlink"), load_model_shape("llama-3.1-8b").kv_bytes_per_token,
                     kept_reply=kept_reply)
    conversation = SimConversation("c", (SimTurn(200, 160), SimTurn(16, 4)))
    records = Simulator(setup).run([Arrival(0.0, conversation)]).records
    return records[1].ttft_s


def test_a_reply_sent_back_as_text_hits_only_its_kept_share() -> None:
    whole = _turn2_ttft(None)  # the reply's own ids come back: all of it hits
    nothing = _turn2_ttft(lambda n: 0)
    half = _turn2_ttft(lambda n: n // 2)
    # the hand cost charges 0.1 ms per computed prompt token: 160 reply tokens recomputed
    # cost 16 ms, half of them 8 ms (block rounding aside)
    assert nothing - whole == pytest.approx(0.016, abs=0.002)
    assert half - whole == pytest.approx(0.008, abs=0.002)


def test_kept_reply_tokens_follow_the_measured_table(monkeypatch) -> None:
    from profiler.simulator import paper_client

    monkeypatch.setattr(paper_client, "REPLY_HIT_SHARE", {32: 1.0, 128: 0.5, 512: 0.25})
    sizes = (0, 16, 64, 128, 300, 512, 4096)
    kept = [paper_client.kept_reply_tokens(n) for n in sizes]
    # shorter than the shortest: its share; between: the share at or below; past the
    # longest: that share
    assert kept == [0, 16, 64, 64, 150, 128, 1024]
    assert all(k <= n for k, n in zip(kept, sizes, strict=True))
    assert all(0.0 <= share <= 1.0 for share in paper_client.REPLY_HIT_SHARE.values())


def test_the_paper_client_refuses_to_run_without_its_measurement(monkeypatch) -> None:
    from profiler.simulator import paper_client

    monkeypatch.setattr(paper_client, "REPLY_HIT_SHARE", {})
    with pytest.raises(ValueError, match="benchmarks.reply_retokenization"):
        RunSpec(layout="1P1D", dataset="synthetic:small-tiny", qps=1.0, client="paper")
    with pytest.raises(ValueError, match="unknown client 'bogus'"):
        RunSpec(layout="1P1D", dataset="synthetic:small-tiny", qps=1.0, client="bogus")


def test_paper_setup_has_fifty_connections_the_reply_model_and_hashed_placement(hand_preset: str,
                                                                monkeypatch) -> None:
    from profiler.simulator import paper_client
    from profiler.simulator.run import setup_for

    if not paper_client.REPLY_HIT_SHARE:
        monkeypatch.setattr(paper_client, "REPLY_HIT_SHARE", {128: 0.5})

    setup = setup_for(RunSpec(layout="1P1D", dataset="synthetic:small-tiny", qps=1.0,
                              cost=hand_preset, model="llama-3.1-8b", client="paper"))
    assert setup.client_connections == paper_client.PAPER_CONNECTIONS == 50
    assert setup.kept_reply is paper_client.kept_reply_tokens
    ideal = setup_for(RunSpec(layout="1P1D", dataset="synthetic:small-tiny", qps=1.0,
                              cost=hand_preset, model="llama-3.1-8b"))
    assert ideal.client_connections is None and ideal.kept_reply is None
    # the paper's proxy places conversations by hash (one draw per run); ppd's by load
    assert setup.placement_seed is not None and ideal.placement_seed is None


def test_fresh_arrivals_draw_each_runs_arrivals_afresh() -> None:
    def spec(layout: str, policy: Policy, fresh: bool) -> RunSpec:
        return RunSpec(layout=layout, dataset="synthetic:small-tiny", qps=2.0,
                       policy=PolicyConfig(kind=policy), client="paper", fresh_arrivals=fresh)

    configurations = (("4R", Policy.REPLICA), ("1P3D", Policy.PD), ("1P3D", Policy.LOCAL),
                      ("2P2D", Policy.PD))
    shared = {arrival_seed(spec(layout, policy, False)) for layout, policy in configurations}
    assert shared == {0}  # by default one draw on every configuration (common arrivals)
    fresh = [arrival_seed(spec(layout, policy, True)) for layout, policy in configurations]
    assert len(set(fresh)) == len(fresh)  # the paper's script: one draw per configuration
    assert arrival_seed(spec("4R", Policy.REPLICA, True)) == fresh[0]  # and reproducible
    # and afresh per workload and load point too (one draw per run, as the script's)
    other = RunSpec(layout="4R", dataset="synthetic:large-tiny", qps=2.0,
                    policy=PolicyConfig(kind=Policy.REPLICA), client="paper",
                    fresh_arrivals=True)
    assert arrival_seed(other) != fresh[0]
    assert arrival_seed(replace(other, qps=4.0)) != arrival_seed(other)


def test_the_papers_proxy_names_a_conversation_by_its_first_user_format_turn() -> None:
    """comprehensive_proxy.py hashes a prompt's first "User:" segment, else its first 200
    characters: a turn 2 written as "User: ..." after a turn 1 in another format is a new
    conversation to it - 1/3 x 2/3 of the script's conversations."""
    from profiler.simulator.paper_client import proxy_conversation, user_format

    ids = [f"c{i}" for i in range(9000)]
    assert all(proxy_conversation(cid, 1, 5) == (cid, 1) for cid in ids)
    renamed = [cid for cid in ids if proxy_conversation(cid, 2, 5) != (cid, 2)]
    assert len(renamed) / len(ids) == pytest.approx(2 / 9, abs=0.015)
    for cid in renamed:
        assert not user_format(cid, 1, 5) and user_format(cid, 2, 5)
        assert proxy_conversation(cid, 2, 5) == (f"{cid}@2", 1)
        assert proxy_conversation(cid, 3, 5) == (f"{cid}@2", 2)  # later turns continue it
    for cid in ids[:300]:  # a turn 1 in the User format names the conversation for good
        if user_format(cid, 1, 5):
            assert all(proxy_conversation(cid, turn, 5) == (cid, turn) for turn in (2, 3, 4))
    assert renamed != [cid for cid in ids if proxy_conversation(cid, 2, 6) != (cid, 2)]


def _renamed_turn2(layout: str, policy: Policy, rename: bool, seed: int | None = None) -> list:
    def names(cid: str, turn: int) -> tuple[str, int]:
        return (f"{cid}@2", 1) if rename and turn == 2 else (cid, turn)

    setup = SimSetup(Layout.parse(layout), HAND, RoutingPolicy(PolicyConfig(kind=policy)),
                     load_link("nvlink"), load_model_shape("llama-3.1-8b").kv_bytes_per_token,
                     placement_seed=seed, proxy_names=names, readback_ttl_s=None)
    conversation = SimConversation("c0", (SimTurn(200, 160), SimTurn(16, 4)))
    return Simulator(setup).run([Arrival(0.0, conversation)]).records


def test_a_turn_the_papers_proxy_takes_for_a_new_conversation_is_routed_as_a_first_turn() -> None:
    from profiler.simulator.layout import sim_nodes
    from profiler.simulator.sim_proxy import hashed_placement

    kept = _renamed_turn2("1P1D", Policy.LOCAL, rename=False)[1]
    assert (kept.route, kept.proxy_turn) == ("local", 2)
    renamed = _renamed_turn2("1P1D", Policy.LOCAL, rename=True)[1]
    assert (renamed.route, renamed.proxy_turn) == ("pd", 1)  # x=1, yet it goes P->D
    # on replicas it goes to the new name's hashed replica: a seed that puts it on the
    # other one makes that replica prefill the whole history
    urls = sorted(node.url for node in sim_nodes(Layout.parse("2R")))
    seed = next(s for s in range(100)
                if hashed_placement(urls, "c0", s) != hashed_placement(urls, "c0@2", s))
    same = _renamed_turn2("2R", Policy.REPLICA, rename=False, seed=seed)
    moved = _renamed_turn2("2R", Policy.REPLICA, rename=True, seed=seed)
    assert same[1].decode == same[0].decode and moved[1].decode != moved[0].decode
    # 200 + 160 history tokens computed again at 0.1 ms each (block rounding aside)
    assert moved[1].ttft_s - same[1].ttft_s == pytest.approx(0.036, abs=0.003)


def test_paper_setup_names_conversations_as_the_papers_proxy(hand_preset: str) -> None:
    from profiler.simulator.paper_client import proxy_conversation
    from profiler.simulator.run import setup_for

    spec = RunSpec(layout="1P1D", dataset="synthetic:small-tiny", qps=1.0, cost=hand_preset,
                   model="llama-3.1-8b", client="paper")
    names = setup_for(spec).proxy_names
    assert names is not None
    assert [names(f"c{i}", 2) for i in range(50)] == \
        [proxy_conversation(f"c{i}", 2, arrival_seed(spec)) for i in range(50)]
    assert setup_for(replace(spec, client="ideal")).proxy_names is None
