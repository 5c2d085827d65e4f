"""The decision table `ppd sim plan` builds for ppd from its traffic (`plan_tables`)."""

from __future__ import annotations

from profiler.planning.plan_tables import (
    MAX_CELLS,
    conversation_turns,
    profile_duration_s,
    traffic_cells,
)
from profiler.simulator.workload import SimConversation, SimTurn
from proxy.shared.discretize import ContextClass


def test_cells_cover_the_common_turns_first_until_the_coverage() -> None:
    # 9 turns 2+ of a small-context mid_bal shape, 1 of a large-context big_paste
    conversations = [SimConversation(f"c{i}", (SimTurn(100, 100), SimTurn(128, 128)))
                     for i in range(9)]
    conversations.append(SimConversation("big", (SimTurn(2000, 100), SimTurn(512, 64))))
    turns = list(conversation_turns(conversations))
    assert turns[0] == (200, 128, 128) and turns[-1] == (2100, 512, 64)
    cells = traffic_cells(turns, 12.3456)
    assert [(c.context_class, c.workload, c.qps) for c in cells] == [
        (ContextClass.SMALL, "mid_bal", 12.346)]  # 90% covered by the first
    both = traffic_cells(turns, 4.0, coverage=0.95)
    assert [c.workload for c in both] == ["mid_bal", "big_paste"]
    assert len(traffic_cells(turns, 4.0, coverage=1.0, max_cells=1)) == 1 <= MAX_CELLS


def test_a_cell_is_measured_over_about_100_conversations_within_2_to_5_s() -> None:
    assert profile_duration_s(6.0) == 5.0  # 3 conversations/s: 15 of them in 5 s
    assert profile_duration_s(100.0) == 2.0  # 50/s: 100 in 2 s
    assert profile_duration_s(1000.0) == 2.0  # never under 2 s
