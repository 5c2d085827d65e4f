"""Replay summaries: percentiles as vLLM's benchmark computes them, groups, SLOs, routes."""

from __future__ import annotations

import numpy as np
import pytest

from profiler.replay.metrics import meets_slo, summarize, turn2plus_latency
from profiler.traces.request_records import RequestRecord


def _record(turn: int, ttft: float | None, tpot: float | None = 0.01, *, ok: bool = True,
            route: str | None = "pd", n_out: int = 11, n_in: int | None = 100,
            conv: str = "c") -> RequestRecord:
    return RequestRecord(
        conversation_id=conv, turn=turn, route=route, decode="d", prefill=None,
        start_s=0.0, ttft_s=ttft, tpot_s=tpot if ok else None,
        e2e_s=(ttft or 0) + (tpot or 0) * (n_out - 1), itl_s=(0.01, 0.02),
        n_input_tokens=n_in, n_output_tokens=n_out if ok else 0, success=ok,
        error=None if ok else "HTTP 503: down", status=200 if ok else 503,
    )


def test_percentiles_interpolate_linearly_like_numpy() -> None:
    ttfts = [0.1, 0.2, 0.3, 0.4, 1.0]
    records = [_record(1, t, conv=f"c{i}") for i, t in enumerate(ttfts)]
    summary = summarize(records, wall_time_s=10.0)
    ms = [t * 1000 for t in ttfts]
    assert summary["turn1_ttft_ms_mean"] == pytest.approx(np.mean(ms))
    assert summary["turn1_ttft_ms_p50"] == pytest.approx(300.0)
    assert summary["turn1_ttft_ms_p90"] == pytest.approx(760.0)  # 400 + 0.6 * 600
    assert summary["turn1_ttft_ms_p99"] == pytest.approx(np.percentile(ms, 99))
    assert summary["turn2plus_ttft_ms_mean"] is None  # no turn 2: null, never 0


def test_turn_groups_throughput_and_failures() -> None:
    records = [
        _record(1, 0.5, conv="a"), _record(2, 0.1, route="local", conv="a"),
        _record(3, 0.2, route="pd", conv="a"), _record(1, 0.6, conv="b"),
        _record(2, None, ok=False, route="local", conv="b"),
    ]
    summary = summarize(records, wall_time_s=2.0)
    assert summary["n_requests"] == 5 and summary["n_success"] == 4
    assert summary["n_turn1"] == 2 and summary["n_turn2plus"] == 3
    assert summary["n_conversations"] == 2
    assert summary["success_rate"] == pytest.approx(0.8)
    assert summary["turn1_ttft_ms_mean"] == pytest.approx(550.0)
    assert summary["turn2plus_ttft_ms_mean"] == pytest.approx(150.0)
    assert summary["output_tok_s"] == pytest.approx(4 * 11 / 2.0)
    assert summary["total_tok_s"] == pytest.approx(4 * 111 / 2.0)
    assert summary["requests_s"] == pytest.approx(2.0)
    # turn 2+ with a route header: local, pd, local -> 2/3 (a failed turn still was routed)
    assert summary["local_share"] == pytest.approx(2 / 3)
    assert summary["routes"] == {"local": 2, "pd": 3}
    assert summary["slo_attainment"] is None


def test_local_share_is_none_without_route_headers() -> None:
    summary = summarize([_record(1, 0.1, route=None), _record(2, 0.1, route=None)], 1.0)
    assert summary["local_share"] is None


def test_slo_attainment_counts_failures_as_misses() -> None:
    records = [
        _record(1, 0.1, 0.01), _record(1, 0.3, 0.01),  # ttft miss
        _record(2, 0.1, 0.05),  # tpot miss
        _record(2, 0.1, None, n_out=1),  # single token: no TPOT, meets
        _record(2, None, ok=False),
    ]
    summary = summarize(records, 1.0, slo=(200.0, 20.0))
    assert summary["slo_attainment"] == pytest.approx(2 / 5)
    assert (summary["slo_ttft_ms"], summary["slo_tpot_ms"]) == (200.0, 20.0)
    assert meets_slo(records[0], (200.0, 20.0)) and not meets_slo(records[4], (1e9, 1e9))


def test_turn2plus_latency_for_the_profiler() -> None:
    records = [_record(1, 9.0, 0.9)] + [_record(2, t / 100, t / 1000) for t in range(1, 101)]
    records.append(_record(2, None, ok=False))
    latency = turn2plus_latency(records)
    ttft_ms = [t * 10.0 for t in range(1, 101)]
    assert latency.n_requests == 101
    assert latency.success_rate == pytest.approx(100 / 101)
    assert latency.ttft_mean_ms == pytest.approx(np.mean(ttft_ms))
    assert latency.ttft_p99_ms == pytest.approx(np.percentile(ttft_ms, 99))
    assert latency.tpot_mean_ms == pytest.approx(np.mean([t for t in range(1, 101)]))
    empty = turn2plus_latency([_record(1, 0.1)])
    assert empty.n_requests == 0 and empty.ttft_mean_ms is None and empty.success_rate is None
