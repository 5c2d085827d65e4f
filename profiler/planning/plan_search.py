"""The search `ppd sim plan` runs: which (layout, policy) candidates, in what order, on what.

Four steps, in one pool of worker processes forked before any cost preset is loaded (as
`grid.run_grid`: no native thread state is copied across fork):
1. the idle reference of each seed's conversations (`slo.idle_ttfts`), which the SLO needs;
2. screen: every P:D split (`plan_space`) under the P/D policies asked for but ppd, and the
   replicas-alone layout under replica, on the first seed;
3. widen: hybrids beside the best split's P share under live (`plan_space.hybrids_near`), and
   ppd on the TABLE_SPLITS best splits, with a decision table (shipped, or built from the
   traffic's cells: `plan_tables`);
4. confirm: the CONFIRM best candidates so far on the other seeds, so the ranking can say
   whether its first two are apart (`plan_rank`).
Each run's row has the replay summary's numbers and the SLO's (`slo.slo_summary`).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.planning.plan_space import Space, hybrids_near, p_share, policies_for
from profiler.planning.plan_tables import MAX_CELLS
from profiler.simulator.slo import IdleTtfts, Slo, idle_ttfts, slo_summary
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.policies import ppd as ppd_policy
from proxy.policies import registry
from proxy.policies import replica as replica_policy

if TYPE_CHECKING:
    import pandas as pd

    from profiler.simulator.run import RunSpec

TABLE_SPLITS = 2  # P:D splits that get a ppd run (each needs a table)
CONFIRM = 5  # candidates re-run on every seed
# What a row keeps of the replay summary.
SUMMARY_KEYS = ("n_conversations", "n_requests", "success_rate", "turn2plus_ttft_ms_p50",
                "turn2plus_ttft_ms_p90", "tpot_ms_p50", "tpot_ms_p90", "local_share",
                "replica_share", "wall_time_s")
TABLE_CELL_RUNS = 0.25  # a table cell's measurement, in runs (for the estimate)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One configuration the plan ranks: a layout (at simulated size) and a policy label."""

    layout: str
    policy: str


@dataclass(frozen=True, slots=True)
class RunTask:
    spec: RunSpec
    candidate: Candidate
    full_layout: str
    slices: int
    idle: IdleTtfts
    slo: Slo


def run_task(task: RunTask) -> dict[str, Any]:
    """One simulated run's row (what a worker returns)."""
    from profiler.simulator.run import run_summary, simulate

    started = time.perf_counter()
    result = simulate(task.spec)
    summary = run_summary(task.spec, result)
    row: dict[str, Any] = {"layout": task.full_layout, "policy": task.candidate.policy,
                           "simulated_layout": task.candidate.layout, "seed": task.spec.seed}
    row.update({key: summary.get(key) for key in SUMMARY_KEYS})
    row.update(slo_summary(result.records, arrival_window_s(task.spec), task.idle, task.slo))
    if row["goodput_turns_s"] is not None:  # one slice's goodput -> the cluster's
        row["goodput_turns_s"] *= task.slices
    row["cpu_s"] = time.perf_counter() - started
    return row


def arrival_window_s(spec: RunSpec) -> float:
    """Seconds over which the run's traffic arrived: its duration, a timed trace's window
    divided by its time scale (RunSpec.qps)."""
    from profiler.simulator.workload import is_timed_dataset

    return spec.duration_s / spec.qps if is_timed_dataset(spec.dataset) else spec.duration_s


def _reference(spec: RunSpec) -> tuple[int, dict[tuple[str, int], float]]:
    return spec.seed, idle_ttfts(spec)


def _measure(args: Any) -> dict[str, Any]:
    from profiler.profile.on_simulator import measure_cell

    return measure_cell(args)


class PlanSearch:
    """Runs the steps of the module docstring on a pool; `rows` holds every run's row."""

    def __init__(self, base: RunSpec, space: Space, *, policies: Sequence[str],
                 seeds: Sequence[int], slo: Slo, processes: int, table_dir: Path,
                 work_dir: Path, say: Callable[[str], None]) -> None:
        self.base, self.space, self.slo = base, space, slo
        self.policies = tuple(policies)
        self.seeds = tuple(seeds)
        self.processes = processes
        self.table_dir, self.work_dir = table_dir, work_dir
        self.say = say
        self.rows: list[dict[str, Any]] = []
        self.idle: dict[int, IdleTtfts] = {}
        self.pilot_s = 0.0
        self.tables: dict[str, Path] = {}
        self._pool: Any = None

    def __enter__(self) -> PlanSearch:
        if self.processes > 1:
            self._pool = multiprocessing.get_context("fork").Pool(self.processes)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()

    def _map(self, function: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        if self._pool is None:
            return [function(item) for item in items]
        return list(self._pool.imap(function, items, chunksize=1))

    # step 1
    def references(self) -> None:
        specs = [replace(self.base, seed=seed) for seed in self.seeds]
        for seed, idle in self._map(_reference, specs):
            self.idle[seed] = idle

    def screen_candidates(self) -> list[Candidate]:
        policies = tuple(p for p in self.policies if not _is_ppd(p))
        out = [Candidate(layout, label) for layout in self.space.splits
               for label in policies_for(layout, policies)]
        if self.space.replica_layout:
            out.append(Candidate(self.space.replica_layout, replica_policy.NAME))
        return out

    def pilot(self, candidate: Candidate) -> None:
        """The first screened run, alone: its time makes the search's estimate."""
        started = time.perf_counter()
        self._run([candidate], self.seeds[:1], quiet=True)
        self.pilot_s = time.perf_counter() - started

    def estimate_s(self, screened: int) -> tuple[int, float]:
        """Runs the search will make at most, and the wall seconds they should take (from the
        pilot run's time)."""
        hybrids = 3 * len([p for p in self.policies if policies_for("1P1D1R", (p,))])
        ppd = TABLE_SPLITS if any(_is_ppd(p) for p in self.policies) else 0
        runs = screened + hybrids + ppd + CONFIRM * (len(self.seeds) - 1)
        tables = ppd * MAX_CELLS * TABLE_CELL_RUNS
        return runs, (runs - 1 + tables) * self.pilot_s / max(self.processes, 1)

    # steps 2-4
    def screen(self, candidates: Sequence[Candidate]) -> None:
        self._run(candidates, self.seeds[:1])

    def widen(self) -> None:
        first = self._frame()
        splits = first[first["simulated_layout"].isin(self.space.splits)]
        if splits.empty:
            return
        best_by_layout = _ordered(splits).drop_duplicates("simulated_layout")
        best_share = p_share(str(best_by_layout.iloc[0]["simulated_layout"]))
        candidates = [Candidate(layout, label)
                      for layout in hybrids_near(self.space, best_share)
                      for label in policies_for(layout, self.policies)]
        ppd_labels = [p for p in self.policies if _is_ppd(p)]
        if ppd_labels:
            top = [str(name) for name in best_by_layout["simulated_layout"][:TABLE_SPLITS]]
            self._tables(top)
            candidates += [Candidate(layout, label) for layout in top for label in ppd_labels]
        self._run(candidates, self.seeds[:1])

    def confirm(self) -> None:
        if len(self.seeds) < 2:
            return
        best = _ordered(self._frame()).head(CONFIRM)
        candidates = [Candidate(str(row.simulated_layout), str(row.policy))
                      for row in best.itertuples()]
        self._run(candidates, self.seeds[1:])

    def _run(self, candidates: Iterable[Candidate], seeds: Sequence[int],
             quiet: bool = False) -> None:
        tasks = [RunTask(self._spec(candidate, seed), candidate,
                         self.space.full_name(candidate.layout), self.space.slices,
                         self.idle[seed], self.slo)
                 for candidate in candidates for seed in seeds]
        started = time.perf_counter()
        self.rows += self._map(run_task, tasks)
        if not quiet:
            self.say(f"  {len(tasks)} runs in {time.perf_counter() - started:.0f} s")

    def _spec(self, candidate: Candidate, seed: int) -> RunSpec:
        name, flags = registry.parse_label(candidate.policy,
                                           lambda: self.tables.get(candidate.layout))
        return replace(self.base, layout=candidate.layout, seed=seed,
                       policy=PolicyConfig(kind=Policy(name), **flags))

    def _tables(self, layouts: Sequence[str]) -> None:
        from profiler.planning.plan_tables import plan_cells, table_task, write_plan_table
        from profiler.simulator.grid import shipped_table

        cells = plan_cells(self.base)
        for layout in layouts:
            shipped = shipped_table(self.table_dir, self.base.cost, layout)
            if shipped.is_file():
                self.tables[layout] = shipped
                continue
            started = time.perf_counter()
            rows = self._map(_measure, [table_task(self.base, layout, cell) for cell in cells])
            out = self.work_dir / f"{layout.lower()}.csv"
            self.tables[layout] = write_plan_table(
                rows, out, layout=layout, cost=self.base.cost, link=self.base.link,
                model=self.base.model_name, cells=cells)
            self.say(f"  built a ppd table for {layout} ({len(cells)} cells of the traffic) "
                     f"in {time.perf_counter() - started:.0f} s -> {out}")

    def _frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.rows)


def _is_ppd(label: str) -> bool:
    return label.startswith(ppd_policy.NAME)


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """Best first: SLO attainment, then goodput, then turn-2+ TTFT p90 (plan_rank's order)."""
    from profiler.planning.plan_rank import ORDER

    columns = [column for column, _ in ORDER]
    ascending = [ascending for _, ascending in ORDER]
    return frame.sort_values(columns, ascending=ascending, na_position="last")
