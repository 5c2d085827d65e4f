"""One cell of `ppd sim compare`: a simulated run of a trace window, scored against the SLO.

A cell is a (window, layout, time scale, policy) run (`grid.GridCell` plus its window). Its
row holds the grid's coordinates, the replay summary's latency numbers, the SLO's attainment
(`slo.slo_summary`, against the window's idle reference), the KV moved P->D and the history
tokens recomputed:

    recomputed = prompt tokens the engines computed (neither a prefix-cache hit nor read
                 over NIXL) - prompt tokens no earlier request of the window had computed

The second term is the window's alone (`novel_tokens`): a request's leading complete
512-token blocks whose hashes an earlier request of the window carried were computed before
(Mooncake's hashes chain, so an equal id means an equal prefix); the rest of its prompt is
new. Whatever the engines compute beyond that is work a previous turn had already done: a
history that was evicted, or sits on a node the turn was not sent to.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from profiler.simulator.grid import GridCell
from profiler.simulator.slo import IdleTtfts, Slo, slo_summary

if TYPE_CHECKING:
    from profiler.simulator.workload import TimedWorkload

TRACE_BLOCK_TOKENS = 512  # Mooncake's hash block (docs/production-traces.md)
SUMMARY_KEYS = ("n_requests", "n_success", "success_rate", "turn2plus_ttft_ms_p50",
                "turn2plus_ttft_ms_p90", "tpot_ms_p50", "tpot_ms_p90", "local_share",
                "kv_bytes_moved", "wall_time_s")


@dataclass(frozen=True, slots=True)
class CompareCell:
    """One run and what scores it: the window's idle reference and new prompt tokens."""

    cell: GridCell
    window: int  # index of the window, 0-based
    idle: IdleTtfts
    novel_tokens: int
    slo: Slo


def novel_tokens(prompts: Iterable[tuple[int, tuple[int, ...]]],
                 block_tokens: int = TRACE_BLOCK_TOKENS) -> int:
    """Prompt tokens that no earlier prompt had: each (input_length, hash_ids) in arrival
    order counts its length less its leading complete blocks seen before."""
    seen: set[int] = set()
    total = 0
    for length, hashes in prompts:
        complete = hashes[:length // block_tokens]
        shared = 0
        for block in complete:
            if block not in seen:
                break
            shared += 1
        total += length - shared * block_tokens
        seen.update(complete)
    return total


def window_novel_tokens(workload: TimedWorkload) -> int:
    """`novel_tokens` of a window's requests in their arrival order."""
    ordered = sorted(workload.arrivals, key=lambda arrival: arrival.at)
    prompts = []
    for arrival in ordered:
        prompt = arrival.conversation.turns[0].prompt
        if prompt is not None:
            record = prompt.record
            prompts.append((int(record.input_length), tuple(record.hash_ids)))
    return novel_tokens(prompts)


def computed_prompt_tokens(node_stats: Mapping[str, Mapping[str, Any]]) -> float:
    """Prompt tokens the cluster's engines computed: queried less found in a prefix cache
    or read from another node."""
    return sum(float(stats.get("prefix_cache_queries", 0.0))
               - float(stats.get("prefix_cache_hits", 0.0))
               - float(stats.get("external_prefix_cache_hits", 0.0))
               for stats in node_stats.values())


def run_compare_cell(task: CompareCell) -> dict[str, Any]:
    """The cell's row (what a worker process returns)."""
    from profiler.planning.plan_search import arrival_window_s
    from profiler.simulator.run import run_summary, simulate

    started = time.perf_counter()
    spec = task.cell.spec
    result = simulate(spec)
    summary = run_summary(spec, result)
    row = task.cell.row()
    row["window"] = task.window
    row["window_start_s"] = spec.start_s
    row["window_s"] = spec.duration_s
    row.update({key: summary.get(key) for key in SUMMARY_KEYS})
    row.update(slo_summary(result.records, arrival_window_s(spec), task.idle, task.slo))
    computed = computed_prompt_tokens(result.node_stats)
    row["prompt_tokens_computed"] = computed
    row["history_tokens_recomputed"] = max(computed - task.novel_tokens, 0.0)
    row["cpu_s"] = time.perf_counter() - started
    return row


__all__ = ["CompareCell", "computed_prompt_tokens", "novel_tokens", "run_compare_cell",
           "window_novel_tokens"]
