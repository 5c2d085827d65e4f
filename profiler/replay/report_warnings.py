"""What makes runs given to `ppd report compare` less comparable: another dataset or target,
a warm prefix cache, an interrupted run.

The warm-cache warning: runs that replayed the same conversations (dataset and --seed) on
the same target may find the earlier runs' prompts still in the nodes' prefix caches and
look faster for it - unless they started cold: `ppd replay --reset-prefix-cache` (recorded in
summary.json as `reset_prefix_cache`) or a simulated run (a fresh cluster every time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from profiler.replay.report_runs import Run


def mismatch_warnings(runs: Sequence[Run]) -> list[str]:
    """One sentence per reason the runs' numbers may not compare (see the module docstring)."""
    warnings = []
    for key, what in (("dataset", "datasets"), ("target", "targets")):
        values = {getattr(run, key) for run in runs}
        if len(values) > 1:
            listing = ", ".join(f"{run.label}: {getattr(run, key)}" for run in runs)
            warnings.append(f"the runs replayed different {what} ({listing})")
    warnings += warm_cache_warnings(runs)
    for run in runs:
        if run.interrupted:
            warnings.append(f"{run.label} was interrupted (it holds the turns completed "
                            "before the stop)")
    return warnings


def warm_cache_warnings(runs: Sequence[Run]) -> list[str]:
    """Runs of the same conversations on the same target, some of which did not start cold."""
    same: dict[tuple[Any, ...], list[Run]] = {}
    for run in runs:
        if run.seed is not None:
            same.setdefault((run.dataset, run.seed, run.target), []).append(run)
    warnings = []
    for (dataset, seed, _), group in same.items():
        warm = [run for run in group if not run.cold_start]
        if len(group) < 2 or not warm:
            continue
        labels = ", ".join(run.label for run in group)
        unreset = ", ".join(run.label for run in warm)
        warnings.append(
            f"{labels} replayed the same conversations ({dataset}, --seed {seed}) on the "
            f"same target, and {unreset} did not reset the prefix cache first: a run may find "
            "another's prompts in the nodes' prefix cache and look faster for it; replay "
            "with --reset-prefix-cache (or different --seed values)")
    return warnings
