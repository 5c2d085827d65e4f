"""Summaries of replay records: latency percentiles by turn group, throughput, SLOs, routes.

Latencies are in milliseconds in every summary. Percentiles interpolate linearly between
order statistics (numpy.percentile's default), as vLLM's serving benchmark does. Latency
statistics use successful requests only; the success rate says how many there were. Empty
groups give None (null in JSON), never 0, so a missing measurement cannot pass for a fast one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from profiler.traces.request_records import RequestRecord
from proxy.shared.vocabulary import RouteKind

PERCENTILES = (50, 90, 99)


def _ms(values: Iterable[float | None]) -> list[float]:
    return [v * 1000.0 for v in values if v is not None]


def _stats(prefix: str, values_ms: Sequence[float], percentiles: Iterable[int]) -> dict:
    out: dict[str, float | None] = {f"{prefix}_mean": None}
    out.update({f"{prefix}_p{p}": None for p in percentiles})
    if values_ms:
        array = np.asarray(values_ms, dtype=float)
        out[f"{prefix}_mean"] = float(array.mean())
        for p in percentiles:
            out[f"{prefix}_p{p}"] = float(np.percentile(array, p))
    return out


def meets_slo(record: RequestRecord, slo: tuple[float, float]) -> bool:
    """Successful, TTFT <= slo[0] ms and TPOT <= slo[1] ms (a 1-token answer has no TPOT)."""
    ttft_ms, tpot_ms = slo
    if not record.success or record.ttft_s is None:
        return False
    if record.ttft_s * 1000.0 > ttft_ms:
        return False
    return record.tpot_s is None or record.tpot_s * 1000.0 <= tpot_ms


def summarize(
    records: Sequence[RequestRecord],
    wall_time_s: float,
    *,
    slo: tuple[float, float] | None = None,
) -> dict:
    """One flat dict of run metrics (JSON-ready).

    local_share is the share of turn-2+ requests whose x-ppd-route was `local`, among those
    that carried the header (turn 1 is P->D in every disaggregated policy, so counting it would
    only dilute the number); None when no response carried the header. replica_share is the
    share of all requests that carried the header whose route was `replica` (in a hybrid
    pool under policy live, the conversations it placed on replicas).
    slo_attainment counts every request, a failure being a miss; None without an SLO.
    """
    ok = [r for r in records if r.success]
    turn1 = [r for r in ok if r.turn == 1]
    later = [r for r in ok if r.turn >= 2]
    out_tokens = sum(r.n_output_tokens for r in ok)
    in_tokens = sum(r.n_input_tokens or 0 for r in ok)
    wall = wall_time_s if wall_time_s > 0 else float("nan")
    summary: dict = {
        "n_requests": len(records),
        "n_success": len(ok),
        "n_failed": len(records) - len(ok),
        "n_turn1": sum(1 for r in records if r.turn == 1),
        "n_turn2plus": sum(1 for r in records if r.turn >= 2),
        "n_conversations": len({r.conversation_id for r in records}),
        "success_rate": len(ok) / len(records) if records else None,
        "wall_time_s": wall_time_s,
        "requests_s": len(ok) / wall,
        "output_tok_s": out_tokens / wall,
        "total_tok_s": (out_tokens + in_tokens) / wall,
        "total_output_tokens": out_tokens,
        "total_input_tokens": in_tokens,
    }
    summary.update(_stats("ttft_ms", _ms(r.ttft_s for r in ok), PERCENTILES))
    summary.update(_stats("turn1_ttft_ms", _ms(r.ttft_s for r in turn1), PERCENTILES))
    summary.update(_stats("turn2plus_ttft_ms", _ms(r.ttft_s for r in later), PERCENTILES))
    summary.update(_stats("tpot_ms", _ms(r.tpot_s for r in ok), PERCENTILES))
    summary.update(_stats("turn2plus_tpot_ms", _ms(r.tpot_s for r in later), PERCENTILES))
    summary.update(_stats("itl_ms", _ms(gap for r in ok for gap in r.itl_s), PERCENTILES))
    summary.update(_stats("e2e_ms", _ms(r.e2e_s for r in ok), PERCENTILES))
    routed = [r for r in records if r.turn >= 2 and r.route is not None]
    summary["local_share"] = (
        sum(1 for r in routed if r.route == RouteKind.LOCAL) / len(routed) if routed else None
    )
    headed = [r for r in records if r.route is not None]
    summary["replica_share"] = (
        sum(1 for r in headed if r.route == RouteKind.REPLICA) / len(headed) if headed else None
    )
    summary["routes"] = _counts(r.route or "unknown" for r in records)
    summary["turns"] = _counts(str(r.turn) for r in records)
    summary["slo_ttft_ms"], summary["slo_tpot_ms"] = slo if slo else (None, None)
    summary["slo_attainment"] = (
        sum(1 for r in records if meets_slo(r, slo)) / len(records) if slo and records else None
    )
    return summary


def _counts(keys: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


@dataclass(frozen=True, slots=True)
class TurnLatency:
    """Turn-2+ latency of one measured cell, what the profiler's decision table stores (ms)."""

    ttft_mean_ms: float | None
    ttft_p99_ms: float | None
    tpot_mean_ms: float | None
    tpot_p99_ms: float | None
    success_rate: float | None
    n_requests: int


def turn2plus_latency(records: Sequence[RequestRecord]) -> TurnLatency:
    """Mean and P99 TTFT/TPOT over successful turn>=2 requests, and their success rate."""
    later = [r for r in records if r.turn >= 2]
    ok = [r for r in later if r.success]
    ttft = _stats("ttft", _ms(r.ttft_s for r in ok), (99,))
    tpot = _stats("tpot", _ms(r.tpot_s for r in ok), (99,))
    return TurnLatency(
        ttft_mean_ms=ttft["ttft_mean"],
        ttft_p99_ms=ttft["ttft_p99"],
        tpot_mean_ms=tpot["tpot_mean"],
        tpot_p99_ms=tpot["tpot_p99"],
        success_rate=len(ok) / len(later) if later else None,
        n_requests=len(later),
    )
