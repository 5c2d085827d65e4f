"""The SLO of issue #43 (`profiler.simulator.slo`): the bound, a turn's verdict, a run's
attainment and goodput, and the idle reference measured on the simulator."""

from __future__ import annotations

import pytest

from profiler.replay.client import RequestRecord
from profiler.simulator.run import RunSpec, simulate
from profiler.simulator.slo import Slo, base_id, idle_ttfts, meets, slo_summary


def _record(conversation: str = "c1", turn: int = 2, ttft_s: float | None = 0.1,
            tpot_s: float | None = 0.01, success: bool = True) -> RequestRecord:
    return RequestRecord(conversation_id=conversation, turn=turn, route="pd", decode=None,
                         prefill=None, start_s=0.0, ttft_s=ttft_s, tpot_s=tpot_s, e2e_s=1.0,
                         itl_s=(), n_input_tokens=10, n_output_tokens=10, success=success,
                         error=None if success else "boom", status=200 if success else 500)


def test_the_ttft_bound_is_three_times_the_idle_ttft_or_half_a_second() -> None:
    slo = Slo()
    assert slo.ttft_bound_s(0.1) == 0.5  # 3 x 0.1 s is under the floor
    assert slo.ttft_bound_s(0.4) == pytest.approx(1.2)
    assert slo.ttft_bound_s(None) == 0.5  # no reference: the floor alone


def test_a_turn_meets_the_slo_by_its_own_reference() -> None:
    idle = {("c1", 2): 0.4}
    slo = Slo()
    assert meets(_record(ttft_s=1.1), idle, slo)  # 1.1 s <= 3 x 0.4 s
    assert not meets(_record(ttft_s=1.3), idle, slo)
    assert not meets(_record(conversation="c2", ttft_s=0.6), idle, slo)  # floor only
    assert meets(_record(conversation="c1#1", ttft_s=1.1), idle, slo)  # a repeat: same turns
    assert not meets(_record(tpot_s=0.051), idle, slo)
    assert meets(_record(tpot_s=None), idle, slo)  # one token: no TPOT to miss
    assert not meets(_record(success=False), idle, slo)


def test_attainment_counts_every_turn_and_goodput_the_met_ones_per_second() -> None:
    records = [_record(ttft_s=0.1), _record(ttft_s=2.0), _record(success=False),
               _record(ttft_s=0.2)]
    summary = slo_summary(records, 4.0, {}, Slo())
    assert summary == {"slo_met": 2, "slo_attainment": 0.5, "goodput_turns_s": 0.5}
    assert slo_summary([], 1.0, {}, Slo())["slo_attainment"] is None


def test_an_slo_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="TPOT bound must be a finite number > 0"):
        Slo(tpot_ms=0)


def test_base_id_drops_the_repeat_mark() -> None:
    assert base_id("sharegpt-12#3") == "sharegpt-12"


def test_the_idle_reference_is_no_slower_than_the_loaded_run() -> None:
    spec = RunSpec(layout="1P1D", dataset="synthetic:large-mid_paste", qps=4.0, duration_s=3.0)
    idle = idle_ttfts(spec)
    records = simulate(spec).records
    assert {(base_id(r.conversation_id), r.turn) for r in records} <= set(idle)
    # Alone, each turn is at least as fast as under load (a small tolerance for the
    # engine's step alignment), and turn 2 through its better route (local: D holds the
    # history) is faster than turn 1, which prefills everything.
    for record in records:
        assert record.ttft_s is not None
        assert idle[(base_id(record.conversation_id), record.turn)] <= record.ttft_s * 1.05
    first = [ttft for (_, turn), ttft in idle.items() if turn == 1]
    second = [ttft for (_, turn), ttft in idle.items() if turn == 2]
    assert max(second) < min(first)


def test_the_fast_reference_is_the_exact_one_or_a_few_ms_above_it() -> None:
    # Replies cut to their first token, the rest sent back as the next turn's new tokens:
    # P->D unchanged, local prefills the reply it would have found cached on D.
    spec = RunSpec(layout="1P1D", dataset="synthetic:multi-4", qps=2.0, duration_s=3.0)
    fast, exact = idle_ttfts(spec), idle_ttfts(spec, fast=False)
    assert fast.keys() == exact.keys()
    assert any(turn >= 3 for _, turn in exact)
    for key, ttft in exact.items():  # 1 ms below: where a block boundary falls differs
        assert ttft - 0.001 <= fast[key] <= ttft + 0.030, (key, ttft, fast[key])
    for key in (key for key in exact if key[1] == 1):
        assert fast[key] == pytest.approx(exact[key], abs=1e-4)  # turn 1: nothing carried
