"""The load meter, the running mean, reply capture and the metrics' JSON counters."""

from __future__ import annotations

import json

from proxy.forward import ReplyCapture
from proxy.load import RateMeter, RunningMean
from proxy.metrics import ProxyMetrics
from proxy.policies import Decision, Reason
from proxy.route import RouteKind
from proxy.validate import Endpoint
from tests.proxy.helpers import FakeClock


def test_rate_meter_counts_over_a_sliding_window() -> None:
    clock = FakeClock()
    meter = RateMeter(10.0, clock)
    for _ in range(5):
        meter.record()
        clock.now += 1.0
    assert meter.rate() == 0.5  # 5 turns in the last 10 s
    clock.now = 10.5  # the turns at 0.0 s falls out of (0.5, 10.5]
    assert meter.rate() == 0.4
    clock.now = 100.0
    assert meter.rate() == 0.0


def test_running_mean_uses_its_prior_until_it_has_data() -> None:
    mean = RunningMean(128)
    assert mean.value == 128
    mean.add(10)
    mean.add(30)
    assert mean.value == 20


def sse(*payloads: object) -> bytes:
    return b"".join(f"data: {json.dumps(p)}\n\n".encode() for p in payloads) + b"data: [DONE]\n\n"


def test_capture_chat_stream_split_anywhere() -> None:
    data = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
               {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
               {"choices": [{"index": 1, "delta": {"content": "other choice"}}]},
               {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
               {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    for split in (1, 7, len(data) // 2):
        capture = ReplyCapture(Endpoint.CHAT, stream=True)
        for i in range(0, len(data), split):
            capture.feed(data[i:i + split])
        captured = capture.finish()
        assert (captured.text, captured.complete) == ("Hello", True)
        assert captured.usage == {"prompt_tokens": 5, "completion_tokens": 2}


def test_capture_incomplete_and_error_streams() -> None:
    cut = ReplyCapture(Endpoint.COMPLETIONS, stream=True)
    cut.feed(b'data: {"choices": [{"index": 0, "text": "Hi"}]}\n\n')
    assert cut.finish().complete is False
    errored = ReplyCapture(Endpoint.COMPLETIONS, stream=True)
    errored.feed(b'data: {"error": {"message": "boom"}}\n\ndata: [DONE]\n\n')
    assert errored.finish().complete is False


def test_capture_plain_json() -> None:
    capture = ReplyCapture(Endpoint.COMPLETIONS, stream=False)
    capture.feed(b'{"choices": [{"index": 0, "text": "Yes", "finish_reason": "stop"}],')
    capture.feed(b' "usage": {"prompt_tokens": 3, "completion_tokens": 1}}')
    captured = capture.finish()
    assert (captured.text, captured.complete, captured.usage["completion_tokens"]) == (
        "Yes", True, 1)
    broken = ReplyCapture(Endpoint.CHAT, stream=False)
    broken.feed(b"{not json")
    assert broken.finish().complete is False


def test_stats_local_share_and_errors() -> None:
    metrics = ProxyMetrics("ppd", lambda: 3)
    metrics.routed("/v1/chat/completions", RouteKind.PD, Decision(RouteKind.PD, Reason.TURN1), 1)
    for _ in range(3):
        metrics.routed("/v1/chat/completions", RouteKind.LOCAL,
                       Decision(RouteKind.LOCAL, Reason.POLICY), 2)
    metrics.upstream_error("decode", "status")
    stats = metrics.stats()
    assert stats["local_share"] == 0.75
    assert stats["upstream_errors"] == {"decode:status": 1}
    assert b"ppd_sessions_live 3.0" in metrics.exposition()
    # Each app owns its registry: a second instance does not clash with the first.
    assert ProxyMetrics("pd", lambda: 0).stats()["requests"] == 0
