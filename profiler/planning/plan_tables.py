"""The decision table `ppd sim plan` builds for policy `ppd` on a layout that ships none.

A shipped table (tables/GPU-MODEL-LAYOUT.csv, `grid.shipped_table`) is used when it exists.
Otherwise a table is profiled on the simulator as `ppd profile --backend sim` does
(`profiler.profile.on_simulator.measure_cell`: each cell a fresh cluster, turn 2 forced P->D
then local), but only over the cells the plan's traffic falls in: the (context class,
workload shape) cells of its turns 2+ (a timed trace's continuations), most common first,
until COVERAGE of the turns is covered (at most MAX_CELLS), at one load point, the traffic's
own turn rate. A turn in a cell
left out goes P->D (the ppd policy's MISSING_CELL), so a plan's ppd is at worst pd there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.shared.discretize import Cell, context_class, workload_shape

COVERAGE = 0.9
MAX_CELLS = 12
PROFILE_DURATION_S = 5.0  # seconds of arrivals per cell and route (the shipped tables: 10)
# ... shortened at high load to about this many conversations (never under MIN_PROFILE_S): a
# cell at 100 turns/s would otherwise simulate 250 conversations per route.
PROFILE_CONVERSATIONS = 100
MIN_PROFILE_S = 2.0
Shape3 = tuple[int, int, int]  # a turn's (context, new input, output) tokens

if TYPE_CHECKING:  # the simulator is imported by the workers that measure
    from profiler.simulator.run import RunSpec
    from profiler.simulator.workload import SimConversation, TimedWorkload


def conversation_turns(conversations: Sequence[SimConversation]) -> Iterator[Shape3]:
    """(context, new input, output) tokens of every turn 2+ of conversations."""
    for conversation in conversations:
        context = conversation.n_system
        for index, turn in enumerate(conversation.turns):
            if index:
                yield context, turn.n_user, turn.max_tokens
            context += turn.n_user + turn.max_tokens


def timed_turns(workload: TimedWorkload) -> Iterator[Shape3]:
    """The same for a timed trace's requests that continue an earlier one (turn 2+)."""
    for arrival in workload.arrivals:
        turn = arrival.conversation.turns[0]
        if workload.names[arrival.conversation.id][1] >= 2 and turn.prompt is not None:
            context = turn.prompt.record.input_length - turn.n_user
            yield max(context, 0), turn.n_user, turn.max_tokens


def traffic_cells(turns: Iterable[Shape3], turn_rate: float, coverage: float = COVERAGE,
                  max_cells: int = MAX_CELLS) -> list[Cell]:
    """The cells turns 2+ fall in, most common first, until `coverage` of them is covered
    (at most max_cells), all at load point turn_rate (turns per second)."""
    counts: Counter[tuple[Any, str]] = Counter(
        (context_class(context), workload_shape(new, out)) for context, new, out in turns)
    total = sum(counts.values())
    cells: list[Cell] = []
    covered = 0
    for (context_name, shape), count in counts.most_common(max_cells):
        if total and covered / total >= coverage:
            break
        cells.append(Cell(context_name, shape, round(turn_rate, 3)))
        covered += count
    return cells


def turn_rate(conversations: Sequence[SimConversation], conversation_rate: float) -> float:
    """Turns per second the proxy sees: conversations per second x mean turns per conversation."""
    turns = sum(len(conversation.turns) for conversation in conversations)
    return conversation_rate * turns / max(len(conversations), 1)


def plan_cells(base: RunSpec) -> list[Cell]:
    """The cells of the plan's traffic (its first seed's draw or trace window)."""
    from profiler.simulator.workload import (
        conversations_needed,
        is_timed_dataset,
        load_conversations,
        timed_workload,
    )
    from profiler.traces.mooncake import TraceWindow

    if is_timed_dataset(base.dataset):
        workload = timed_workload(base.dataset,
                                  TraceWindow(base.start_s, base.duration_s, base.qps),
                                  seed=base.seed)
        rate = len(workload.arrivals) * base.qps / base.duration_s  # requests per second
        return traffic_cells(timed_turns(workload), rate)
    conversations = load_conversations(
        base.dataset, conversations_needed(base.qps, base.duration_s), seed=base.seed)
    return traffic_cells(conversation_turns(conversations), turn_rate(conversations, base.qps))


def profile_duration_s(turn_rate: float) -> float:
    """Seconds of arrivals a cell is measured over (two-turn conversations at turn_rate / 2)."""
    return min(PROFILE_DURATION_S,
               max(MIN_PROFILE_S, PROFILE_CONVERSATIONS / max(turn_rate / 2, 1e-9)))


def table_task(base: RunSpec, layout: str, cell: Cell) -> tuple[RunSpec, Cell, Any]:
    """One cell's measurement for a worker (`on_simulator.measure_cell`'s argument)."""
    from profiler.profile.runner import PROFILED_ROUTES

    spec = replace(base, layout=layout, duration_s=profile_duration_s(cell.qps),
                   kv_readback_ttl_s=None,
                   fresh_arrivals=False, forced_route=None, max_turns=None,
                   max_context_tokens=None)
    return spec, cell, PROFILED_ROUTES


def write_plan_table(rows: list[dict[str, Any]], out_csv: Path, *, layout: str, cost: str,
                     link: str, model: str, cells: Sequence[Cell]) -> Path:
    """The measured cells as a table file the ppd policy loads (with its meta.json)."""
    from profiler.tables.io import build_meta, write_table

    grid = {"contexts": sorted({str(cell.context_class) for cell in cells}),
            "workloads": sorted({cell.workload for cell in cells}),
            "qps": sorted({cell.qps for cell in cells}),
            "duration_s": max((profile_duration_s(cell.qps) for cell in cells),
                              default=PROFILE_DURATION_S)}
    meta = build_meta(model=model, layout=layout,
                      backend=f"simulated: ppd engine model, cost preset {cost}, link {link}",
                      grid=grid, weights={"w_ttft": 1.0, "w_tpot": 1.0},
                      extra={"simulated": True, "cost": cost, "link": link,
                             "built_by": "ppd sim plan (the traffic's cells only)"})
    write_table(rows, out_csv, meta)
    return out_csv
