"""The real proxy (its own process) in front of an emulated 1P2D H100 cluster (one process):
a local turn 2 answers far sooner than the same turn forced P->D, and each node's time to
first token is what the engine model predicts for the work it did.

Tolerances: a node's measured TTFT (its own vllm:time_to_first_token_seconds, from arrival to
first token) may exceed the modelled step and transfer times by NODE_SLACK_S - HTTP parsing,
tokenizing and event-loop wake-ups of a Python process on this shared 2-core machine - and
undercut them by timer granularity only (EARLY_S). When the machine is busy, the emulator
delivers steps late and says so (ppd:emulator_lag_seconds); that reported lateness is allowed
on top, so a loaded machine shows up as lag, not as a model error. Client-side TTFTs add the
proxy's legs
(tens of ms of jitter here), so they are compared by their medians over CONVERSATIONS
conversations per route.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from profiler.cluster.emulated import start_emulated_cluster
from profiler.cluster.launcher import Cluster
from profiler.cluster.plan import ClusterConfig, parse_layout
from profiler.emulate.presets import Preset, resolve
from profiler.engine.batch import BatchShape
from proxy.shared.vocabulary import Role

pytest.importorskip("aiconfigurator_core", reason="the h100 preset needs ppd[sim]")

MODEL = "llama-3.1-8b"
BASE_PORT = 18300  # above the vLLM e2e blocks (18100-18119)
PROXY_PORT = 18390
NODE_SLACK_S = 0.020
EARLY_S = 0.001
CONVERSATIONS = 3  # per route
HISTORY = "Rivers carry silt to the sea, and over many years the silt builds a delta. " * 150
REPLY_TOKENS = 512
QUESTION = "And how do lakes form, and why are some of them salty?"
TTFT = "vllm:time_to_first_token_seconds_sum"
HITS = "vllm:prefix_cache_hits_total"
EXTERNAL = "vllm:external_prefix_cache_hits_total"
LAG = "ppd:emulator_lag_seconds_total"


ADMIN_KEY = "test-admin"  # forcing a route needs the proxy's admin key


@pytest.fixture(scope="module")
def preset() -> Preset:
    preset = resolve("h100", MODEL)
    preset.warm()
    return preset


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config = ClusterConfig(model=MODEL, layout=parse_layout("1P2D"), base_port=BASE_PORT,
                           state_dir=tmp_path_factory.mktemp("emulated-1p2d"))
    with pytest.MonkeyPatch.context() as env:  # the tokenizer is built here, not in ~/.cache
        env.setenv("PPD_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        running = start_emulated_cluster(config, "h100")
    with running:
        running.start_proxy("local", port=PROXY_PORT, extra_args=["--admin-key", ADMIN_KEY])
        yield running


@dataclass
class Turn:
    route: str
    decode: str
    ttft_s: float
    text: str
    usage: dict[str, Any]


def node_counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_sum", "_total")):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def say(client: httpx.Client, url: str, session: str, messages: list[dict[str, str]],
        max_tokens: int, route: str | None = None) -> Turn:
    forced = {"x-ppd-route": route, "authorization": f"Bearer {ADMIN_KEY}"} if route else {}
    headers = {"x-session-id": session, **forced}
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    usage: dict[str, Any] = {}
    with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                       headers=headers) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for choice in event["choices"]:
                if choice["delta"].get("content"):
                    first = first if first is not None else time.perf_counter() - started
                    parts.append(choice["delta"]["content"])
    assert first is not None
    return Turn(response.headers["x-ppd-route"], response.headers["x-ppd-decode"], first,
                "".join(parts), usage)


def turn_one(client: httpx.Client, url: str, session: str) -> tuple[list[dict[str, str]], Turn]:
    """Turn 1 (P->D); the messages of turn 2 and the turn."""
    messages = [{"role": "user", "content": f"[{session}] {HISTORY}"}]
    first = say(client, url, session, messages, REPLY_TOKENS)
    return [*messages, {"role": "assistant", "content": first.text},
            {"role": "user", "content": QUESTION}], first


@dataclass
class Observed:
    """A turn 2 and every node's counters around it (the cluster was otherwise idle)."""

    turn: Turn
    before: dict[str, dict[str, float]]
    after: dict[str, dict[str, float]]

    def grew(self, node: str, name: str) -> float:
        return self.after[node][name] - self.before[node][name]


def step_s(preset: Preset, tokens: int, context: int) -> float:
    return preset.cost.step_ms(BatchShape(1, tokens, context, 0, 0)) / 1000


def local_model_s(preset: Preset, seen: Observed) -> float:
    """D prefills what its cache lacks: the question, after turn 1's prompt and reply."""
    prompt = seen.turn.usage["prompt_tokens"]
    hit = int(seen.grew(seen.turn.decode, HITS))
    return step_s(preset, prompt - hit, hit)


def pd_model_s(preset: Preset, seen: Observed, p_url: str) -> tuple[float, float]:
    """P prefills what it lacks (turn 1's reply and the question); D pulls what it lacks from
    P and recomputes the last prompt token. (P's time, D's time.)"""
    prompt = seen.turn.usage["prompt_tokens"]
    p_hit = int(seen.grew(p_url, HITS))
    pulled = seen.grew(seen.turn.decode, EXTERNAL)
    transfer = preset.link.transfer_time(pulled * preset.model.kv_bytes_per_token)
    return step_s(preset, prompt - p_hit, p_hit), transfer + step_s(preset, 1, prompt - 1)


def within(seen: Observed, node: str, model: float) -> bool:
    """The node's TTFT over the turn matches the model, allowing the lateness it reported."""
    measured = seen.grew(node, TTFT)
    return model - EARLY_S <= measured <= model + NODE_SLACK_S + seen.grew(node, LAG)


def test_local_turn_two_beats_forced_pd_as_the_engine_model_predicts(
    cluster: Cluster, preset: Preset
) -> None:
    url, p_url = cluster.proxy_url, cluster.url(Role.PREFILL)
    nodes = [p_url, *cluster.urls(Role.DECODE)]
    sessions = [(f"conv-{i}", "pd" if i % 2 else None) for i in range(2 * CONVERSATIONS)]
    with httpx.Client(timeout=120) as client, ThreadPoolExecutor(len(sessions)) as pool:
        opened = list(pool.map(lambda s: turn_one(client, url, s[0]), sessions))
        observed: list[tuple[str | None, Observed]] = []
        for (session, route), (messages, first) in zip(sessions, opened, strict=True):
            assert first.route == "pd"
            before = {n: node_counters(n) for n in nodes}
            turn = say(client, url, session, messages, 8, route)
            observed.append((route, Observed(turn, before, {n: node_counters(n) for n in nodes})))
            assert turn.decode == first.decode  # the session keeps its D on either route
            assert turn.route == (route or "local")
            assert turn.usage["completion_tokens"] == 8

    local_ttft, pd_ttft, local_models, pd_models = [], [], [], []
    for route, seen in observed:
        node_ttft = seen.grew(seen.turn.decode, TTFT)
        if route is None:
            model = local_model_s(preset, seen)
            assert within(seen, seen.turn.decode, model), (node_ttft, model)
            local_ttft.append(seen.turn.ttft_s)
            local_models.append(model)
        else:
            p_model, d_model = pd_model_s(preset, seen, p_url)
            assert within(seen, p_url, p_model), (seen.grew(p_url, TTFT), p_model)
            assert within(seen, seen.turn.decode, d_model), (node_ttft, d_model)
            pd_ttft.append(seen.turn.ttft_s)
            pd_models.append(p_model + d_model)
    # The model says local is far faster; the client sees the same, proxy legs included.
    assert max(local_models) < min(pd_models) / 2
    assert statistics.median(local_ttft) < statistics.median(pd_ttft)


def test_the_cluster_file_says_emulated(cluster: Cluster) -> None:
    doc = json.loads(Path(cluster.cluster_file).read_text())
    assert doc["emulated"]["preset"] == "h100:llama-3.1-8b"
    assert "emulated" in doc["emulated"]["backend"]
    assert [n["role"] for n in doc["nodes"]] == ["prefill", "decode", "decode"]
