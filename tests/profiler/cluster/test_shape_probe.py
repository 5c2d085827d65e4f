"""`ppd cluster probe` against a fake vLLM whose counters follow a known prefill step."""

from __future__ import annotations

import json
import time
from dataclasses import asdict

import httpx
import pandas as pd
import pytest

from profiler.cli import main as ppd
from profiler.cluster.shape_probe import (
    ProbeError,
    probe_busy,
    probe_frontend,
    probe_node,
    write_probe,
)
from profiler.engine.calibrate import fit_probe

BLOCK = 128


class FakeVllmWithCounters:
    """Serves /v1/models, /v1/completions and /metrics; a completion advances the counters
    as vLLM would: its prompt, its prefix-cache hit (full blocks it saw before, at least one
    token computed) and a prefill time of 5 ms + 0.01 ms/token + 0.004 ms/token per 1k of
    context, in one step (the fake has no token budget)."""

    def __init__(self, status: int = 200, metrics: bool = True) -> None:
        self.counters = {"prompt_tokens_total": 0.0, "prefix_cache_hits_total": 0.0,
                         "request_prefill_time_seconds_sum": 0.0,
                         "request_queue_time_seconds_sum": 0.0}
        self.seen: set[tuple[int, ...]] = set()
        self.status, self.metrics = status, metrics
        self.forwarded: list[tuple[dict[str, str], list[dict[str, str]]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        if request.url.path == "/metrics":
            if not self.metrics:
                return httpx.Response(200, text="# nothing\n")
            text = "".join(f'vllm:{k}{{engine="0"}} {v}\n' for k, v in self.counters.items())
            return httpx.Response(200, text=text)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "too long"}})
        body = json.loads(request.content)
        if request.url.host == "proxy":  # a chat turn the proxy forwards to this node
            self.forwarded.append((dict(request.headers), body["messages"]))
            prompt = " ".join(message["content"] for message in body["messages"])
        else:
            prompt = body["prompt"]
        ids = prompt if isinstance(prompt, list) else [hash(w) for w in prompt.split()] * 2
        blocks = [tuple(ids[: (i + 1) * BLOCK]) for i in range(len(ids) // BLOCK)]
        hit = 0
        for block in blocks:
            if block not in self.seen:
                break
            hit += BLOCK
        hit = min(hit, (len(ids) - 1) // BLOCK * BLOCK)
        self.seen.update(blocks)
        computed = len(ids) - hit
        step_ms = 5.0 + 0.01 * computed + 0.004 * computed * (hit + computed / 2) / 1000
        self.counters["prompt_tokens_total"] += len(ids)
        self.counters["prefix_cache_hits_total"] += hit
        self.counters["request_prefill_time_seconds_sum"] += step_ms / 1000
        return httpx.Response(200, json={"choices": [{"text": "x",
                                                      "message": {"content": "x"}}]})


def test_probe_times_each_shape_from_the_node_counters() -> None:
    rows = probe_node("http://node", lengths=(128, 512, 1024, 2048), repeats=2,
                      transport=httpx.MockTransport(FakeVllmWithCounters()))
    frame = pd.DataFrame([asdict(row) for row in rows])
    assert set(frame["kind"]) == {"cold", "hit", "append", "text"}
    hits = frame[frame["kind"] == "hit"]
    assert (hits["computed_tokens"] == BLOCK).all()  # vLLM recomputes the last block
    appends = frame[frame["kind"] == "append"]
    assert (appends["computed_tokens"] == 256).all()
    constant, per_token, attention = fit_probe(frame, token_budget=1 << 20)
    assert constant == pytest.approx(5.0, rel=0.01)
    assert per_token == pytest.approx(0.01, rel=0.01)
    assert attention == pytest.approx(0.004, rel=0.01)


def test_probe_refuses_a_node_without_prefill_metrics_or_that_answers_errors() -> None:
    with pytest.raises(ProbeError, match="request_prefill_time_seconds"):
        probe_node("http://node", lengths=(128,), repeats=1,
                   transport=httpx.MockTransport(FakeVllmWithCounters(metrics=False)))
    with pytest.raises(ProbeError, match="answered 400"):
        probe_node("http://node", lengths=(128,), repeats=1,
                   transport=httpx.MockTransport(FakeVllmWithCounters(status=400)))
    with pytest.raises(ProbeError, match="max-model-len"):
        probe_node("http://node", lengths=(4096,), max_model_len=4096,
                   transport=httpx.MockTransport(FakeVllmWithCounters()))


def test_probe_writes_a_csv_calibrate_reads(tmp_path) -> None:
    rows = probe_node("http://node", lengths=(128, 1024), repeats=1,
                      transport=httpx.MockTransport(FakeVllmWithCounters()))
    path = write_probe(rows, tmp_path / "probe")
    frame = pd.read_csv(path)
    assert {"node", "kind", "prompt_tokens", "computed_tokens", "prefill_ms", "queue_ms",
            "client_ms"} <= set(frame.columns)
    assert len(frame) == len(rows)


def test_probe_cli_errors_are_one_clear_line(tmp_path, capsys) -> None:
    assert ppd(["cluster", "probe", "--out", str(tmp_path), "--node", "http://127.0.0.1:9",
                "--lengths", "12x"]) == 1
    assert "--lengths" in capsys.readouterr().err
    assert ppd(["cluster", "probe", "--out", str(tmp_path), "--state",
                str(tmp_path / "none")]) == 1
    assert capsys.readouterr().err.strip()
    assert ppd(["cluster", "probe", "--out", str(tmp_path), "--node",
                "http://127.0.0.1:9"]) == 1
    assert "/v1/models" in capsys.readouterr().err


def test_frontend_probe_goes_through_the_proxy_forced_local_and_reads_the_d() -> None:
    fake = FakeVllmWithCounters()
    rows = probe_frontend("http://d", "http://proxy", admin_key="ADMIN", lengths=(128, 1024),
                          repeats=2, transport=httpx.MockTransport(fake))
    assert [row.kind for row in rows] == ["chat-via-proxy"] * 4
    assert {row.node for row in rows} == {"http://d"}
    assert all(row.prompt_tokens > 0 and row.prefill_ms > 0 for row in rows)
    measured = [(h, messages) for h, messages in fake.forwarded if "x-ppd-route" in h]
    assert len(fake.forwarded) == 8 and len(measured) == 4  # each session opens with a turn 1
    assert all(h["authorization"] == "Bearer ADMIN" for h, _ in fake.forwarded)
    assert all(h["x-ppd-route"] == "local" and len(messages) == 3 for h, messages in measured)
    assert len({h["x-session-id"] for h, _ in measured}) == 4  # one session per measured turn


class OpenStream(httpx.SyncByteStream):
    """A streamed answer that stays open until its client closes it; the fake counts it
    running meanwhile."""

    def __init__(self, fake: FakeBusyVllm) -> None:
        self.fake = fake
        self.closed = False
        fake.open += 1

    def __iter__(self):  # noqa: ANN204
        while not self.closed:
            yield b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'
            time.sleep(0.01)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.fake.open -= 1


class FakeBusyVllm(FakeVllmWithCounters):
    """Also serves streamed chat turns that decode until closed, exports them as
    vllm:num_requests_running, and counts each completion as one finished request (two for
    every third, as if a background one ended meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.open = 0
        self.completions = 0
        self.counters["request_prefill_time_seconds_count"] = 0.0
        self.streamed: list[tuple[str, dict[str, str]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            self.counters["num_requests_running"] = float(self.open)
        elif request.url.path.endswith("/completions") and json.loads(request.content).get(
                "stream"):
            self.streamed.append((request.url.host, dict(request.headers)))
            return httpx.Response(200, stream=OpenStream(self),
                                  headers={"content-type": "text/event-stream"})
        elif request.url.path == "/v1/completions":
            self.completions += 1
            self.counters["request_prefill_time_seconds_count"] += (
                2 if self.completions % 3 == 0 else 1)
        return super().__call__(request)


def test_busy_probe_times_prompts_while_background_streams_run_on_the_node() -> None:
    fake = FakeBusyVllm()
    rows = probe_busy("http://d", via_url="http://proxy", admin_key="ADMIN", levels=(0, 3),
                      lengths=(128, 1024), repeats=3, settle_s=10,
                      transport=httpx.MockTransport(fake))
    # 6 prompts a level; every third shared its window with another finished request
    assert [row.running for row in rows] == [0] * 4 + [3] * 4
    assert {row.kind for row in rows} == {"busy-text"} and {row.node for row in rows} == {
        "http://d"}
    assert all(row.prompt_tokens > 0 and row.prefill_ms > 0 for row in rows)
    # the background went through the proxy, forced local, with the admin key; all closed
    assert len(fake.streamed) >= 3 and {host for host, _ in fake.streamed} == {"proxy"}
    assert all(h["x-ppd-route"] == "local" and h["authorization"] == "Bearer ADMIN"
               for _, h in fake.streamed)
    assert fake.open == 0


def test_busy_probe_cli_refuses_a_negative_level(tmp_path, capsys) -> None:
    assert ppd(["cluster", "probe", "--out", str(tmp_path), "--node", "http://127.0.0.1:9",
                "--busy", "0,-4"]) == 1
    assert "--busy" in capsys.readouterr().err
