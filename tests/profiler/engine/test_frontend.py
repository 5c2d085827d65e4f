"""The API server as a FIFO queue (profiler/engine/frontend.py) and its fit on the H100 data."""

from __future__ import annotations

import statistics

import pytest

from profiler.engine import measured
from profiler.engine.frontend import ApiServer
from profiler.engine.host import HostModel


def test_a_lone_request_pays_the_front_end_and_a_burst_waits_in_turn() -> None:
    host = HostModel(frontend_request_ms=5.0, frontend_per_token_us=1.0,
                     frontend_service_ms=2.0)
    api = ApiServer.for_host(host)
    # alone: the front end as a delay, 5 ms + 1 us x 1,000 tokens
    assert api.admit(10.0, 1000) == pytest.approx(10.006)
    # three at once, long after: each waits for the ones before it, 2 ms apiece
    times = [api.admit(20.0, 1000) for _ in range(3)]
    assert times == pytest.approx([20.006, 20.008, 20.010])
    # one that arrives after the loop is free again does not wait
    assert api.admit(20.007, 0) == pytest.approx(20.012)
    assert api.admit(30.0, 0, running=4) == pytest.approx(30.005)


def test_no_service_time_is_the_old_fixed_delay() -> None:
    api = ApiServer.for_host(HostModel(frontend_request_ms=5.0))
    assert [api.admit(1.0, 100) for _ in range(5)] == pytest.approx([1.005] * 5)


def test_service_time_fitted_on_the_bursts_reproduces_their_wait(h100) -> None:
    data = measured.default_measurements()
    host = measured.fit_host(h100, data)
    assert 1.0 < host.frontend_service_ms < 6.0
    assert "frontend_service_ms" in host.sources
    # the time outside the engine, mean over B launched together, within 20% at 10-100
    for batch, row in data.decode_means().items():
        if 10 <= batch <= 100:
            api = ApiServer.for_host(host)
            modelled = statistics.fmean(api.admit(0.0, measured.BURST_PROMPT_TOKENS)
                                        for _ in range(batch)) * 1000
            outside = row.client_ttft_ms - row.queue_ms - row.prefill_ms
            assert modelled == pytest.approx(outside, rel=0.20), batch
