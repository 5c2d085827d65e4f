"""Every policy, as a pure function of the workload and the cluster view."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from proxy.config.policy_config import Policy, PolicyConfig
from proxy.policies.fixed import stable_fraction
from proxy.policies.routing import RoutingPolicy
from proxy.policies.table import DecisionTable
from proxy.shared.discretize import Cell, ContextClass
from proxy.shared.vocabulary import Reason, RouteKind, Workload


def work(turn: int = 2, n_in: int = 16, n_ctx: int = 300, n_out: int = 32,
         qps: float = 1.0) -> Workload:
    return Workload(turn, n_in, n_ctx, n_out, qps)


def policy(kind: Policy, **kw: object) -> RoutingPolicy:
    table = kw.pop("table_obj", None)
    return RoutingPolicy(PolicyConfig(kind, **kw), table)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", [Policy.PD, Policy.LOCAL, Policy.THRESHOLD, Policy.FIXED,
                                  Policy("readback")])
def test_turn1_and_homeless_turns_always_go_pd(kind: Policy) -> None:
    p = policy(kind, x=1.0, non_cached_tokens=10**6)
    assert p.decide(work(turn=1), "s", can_local=True).reason is Reason.TURN1
    assert p.decide(work(turn=1), "s", can_local=True).kind is RouteKind.PD
    homeless = p.decide(work(turn=3), "s", can_local=False)
    assert (homeless.kind, homeless.reason) == (RouteKind.PD, Reason.NO_HOME)


def test_pd_and_local() -> None:
    assert policy(Policy.PD).decide(work(), "s", True).kind is RouteKind.PD
    assert policy(Policy.LOCAL).decide(work(), "s", True).kind is RouteKind.LOCAL


def test_readback_policy_reads_back_every_turn_2_plus() -> None:
    decision = policy(Policy("readback")).decide(work(), "s", True)
    assert (decision.kind, decision.reason) == (RouteKind.READBACK, Reason.POLICY)


def test_replica_never_uses_p() -> None:
    decision = policy(Policy.REPLICA).decide(work(turn=1), "s", False)
    assert decision.kind is RouteKind.REPLICA


def test_threshold_is_inclusive_at_n() -> None:
    p = policy(Policy.THRESHOLD, non_cached_tokens=64)
    assert p.decide(work(n_in=64), "s", True).kind is RouteKind.LOCAL
    assert p.decide(work(n_in=65), "s", True).kind is RouteKind.PD


def test_fixed_is_deterministic_and_close_to_x() -> None:
    p = policy(Policy.FIXED, x=0.3)
    runs = [[p.decide(work(turn=t), f"s{i}", True).kind for t in range(2, 12)]
            for i in range(200)]
    again = [[p.decide(work(turn=t), f"s{i}", True).kind for t in range(2, 12)]
             for i in range(200)]
    assert runs == again
    share = sum(k is RouteKind.LOCAL for r in runs for k in r) / 2000
    assert 0.25 < share < 0.35
    assert all(policy(Policy.FIXED, x=0.0).decide(work(), f"s{i}", True).kind is RouteKind.PD
               for i in range(50))
    assert all(policy(Policy.FIXED, x=1.0).decide(work(), f"s{i}", True).kind
               is RouteKind.LOCAL for i in range(50))


def test_stable_fraction_is_the_same_in_another_process() -> None:
    # A process with another hash seed must draw the same value: hash() would not.
    code = ("from proxy.policies.fixed import stable_fraction; "
            "print(repr(stable_fraction('abc', 2)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert float(out.stdout) == stable_fraction("abc", 2)
    assert stable_fraction("abc", 2) != stable_fraction("abc", 3)
    assert 0.0 <= stable_fraction("x", 1) < 1.0


def ppd_table() -> DecisionTable:
    def row(context: str, workload: str, qps: float, local_ttft: float) -> dict[str, object]:
        return {"context_class": context, "workload": workload, "qps": qps,
                "pd_ttft_ms": 100, "pd_tpot_ms": 50, "pd_success": 1,
                "local_ttft_ms": local_ttft, "local_tpot_ms": 50, "local_success": 1,
                "n_requests": 10}
    return DecisionTable.from_rows([
        row("small", "tiny", 1.0, 50),  # local wins
        row("small", "tiny", 4.0, 150),  # pd wins at high load
        row("large", "huge_paste", 1.0, 150),  # pd wins
    ])


def test_ppd_uses_the_cell_of_the_turn() -> None:
    p = policy(Policy.PPD, table=__file__, table_obj=ppd_table())
    low = p.decide(work(n_in=16, n_ctx=300, n_out=32, qps=0.2), "s", True)
    assert (low.kind, low.reason) == (RouteKind.LOCAL, Reason.TABLE)
    assert low.cell == Cell(ContextClass.SMALL, "tiny", 1.0)
    high = p.decide(work(n_in=16, n_ctx=300, n_out=32, qps=3.0), "s", True)
    assert high.kind is RouteKind.PD and high.cell is not None and high.cell.qps == 4.0
    paste = p.decide(work(n_in=900, n_ctx=2000, n_out=30), "s", True)
    assert (paste.kind, paste.cell) == (RouteKind.PD, Cell(ContextClass.LARGE, "huge_paste", 1.0))


def test_ppd_missing_cell_falls_back_to_pd() -> None:
    p = policy(Policy.PPD, table=__file__, table_obj=ppd_table())
    decision = p.decide(work(n_in=16, n_ctx=10_000, n_out=32), "s", True)
    assert (decision.kind, decision.reason) == (RouteKind.PD, Reason.MISSING_CELL)
    assert decision.cell is not None and decision.cell.context_class is ContextClass.HUGE


def test_ppd_weights_change_verdicts() -> None:
    table = DecisionTable.from_rows([{
        "context_class": "small", "workload": "tiny", "qps": 1, "pd_ttft_ms": 200,
        "pd_tpot_ms": 50, "pd_success": 1, "local_ttft_ms": 100, "local_tpot_ms": 60,
        "local_success": 1, "n_requests": 5}])
    latency = policy(Policy.PPD, table=__file__, table_obj=table)
    throughput = policy(Policy.PPD, table=__file__, table_obj=table, w_tpot=3.0)
    assert latency.decide(work(), "s", True).kind is RouteKind.LOCAL
    assert throughput.decide(work(), "s", True).kind is RouteKind.PD


def readback_table() -> DecisionTable:
    """small/tiny at 1/s: pd 200/50 ms, local 100/60 (score -0.1 at w_tpot 3), readback 150/50
    (+0.25): readback wins at w_tpot 3, pd between the two others."""
    return DecisionTable.from_rows([{
        "context_class": "small", "workload": "tiny", "qps": 1, "pd_ttft_ms": 200,
        "pd_tpot_ms": 50, "pd_success": 1, "local_ttft_ms": 100, "local_tpot_ms": 60,
        "local_success": 1, "n_requests": 5, "readback_ttft_ms": 150, "readback_tpot_ms": 50,
        "readback_success": 1}])


def test_ppd_sends_a_turn_to_readback_only_where_it_can_read_back() -> None:
    p = policy(Policy.PPD, table=__file__, table_obj=readback_table(), w_tpot=3.0)
    assert p.decide(work(), "s", True, can_readback=True).kind is RouteKind.READBACK
    # The session's D keeps nothing to read: the cell's verdict between pd and local.
    assert p.decide(work(), "s", True, can_readback=False).kind is RouteKind.PD
