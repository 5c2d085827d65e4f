"""Helpers for the e2e tests: vLLM /metrics counters, an in-process proxy, chat turns."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from profiler.cluster.launcher import Cluster
from proxy import ServerThread, config_from_args, create_app

# The vLLM counters the tests read (sample names, summed over engines and label sets).
PREFIX_HITS = "vllm:prefix_cache_hits_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
REQUESTS = "vllm:request_success_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
COUNTERS = (PREFIX_HITS, EXTERNAL_HITS, REQUESTS, PROMPT_TOKENS)

_WORDS = (
    "river", "mountain", "signal", "packet", "kernel", "window", "garden", "silver", "orange",
    "thunder", "market", "lantern", "engine", "harbor", "velvet", "copper", "meadow", "canyon",
    "violet", "rocket", "planet", "forest", "marble", "tunnel", "whisper", "crystal", "saddle",
    "falcon", "ember", "glacier", "compass", "puzzle", "ribbon", "anchor", "shadow", "voyage",
)


def counters(url: str) -> dict[str, float]:
    """The COUNTERS of the vLLM server at url, read from its /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    totals = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in COUNTERS}


def block_size(url: str) -> int:
    """vLLM's KV block size, from the labels of its vllm:cache_config_info gauge."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:cache_config_info"):
                return int(sample.labels["block_size"])
    raise AssertionError(f"{url}/metrics has no vllm:cache_config_info")


def filler(n_words: int, seed: int) -> str:
    """Deterministic prose-like text; different seeds share no opening words."""
    rng = random.Random(seed)
    return f"Conversation {seed}: " + " ".join(rng.choice(_WORDS) for _ in range(n_words))


@contextmanager
def proxy_for(cluster: Cluster, policy: str, tokenizer: Path) -> Iterator[str]:
    """A ppd proxy (in-process, OS-chosen port) in front of cluster; yields its URL."""
    config = config_from_args(["--cluster", str(cluster.cluster_file), "--policy", policy,
                               "--port", "0", "--tokenizer", str(tokenizer)])
    with ServerThread(create_app(config)) as server:
        yield server.url


@dataclass
class Turn:
    """One answered chat turn as the client saw it."""

    route: str
    turn: int
    decode: str
    prefill: str | None
    content: str
    prompt_tokens: int
    completion_tokens: int


class Conversation:
    """A multi-turn chat through the proxy, keyed by an explicit x-session-id."""

    def __init__(self, proxy_url: str, model: str, session: str, max_tokens: int = 16) -> None:
        self.proxy_url = proxy_url
        self.model = model
        self.session = session
        self.max_tokens = max_tokens
        self.messages: list[dict[str, str]] = []

    def say(self, text: str, **extra: Any) -> Turn:
        """Send the next user message with the whole history; remember the reply."""
        self.messages.append({"role": "user", "content": text})
        body = {"model": self.model, "messages": self.messages, "max_tokens": self.max_tokens,
                "temperature": 0, "ignore_eos": True, **extra}
        response = httpx.post(f"{self.proxy_url}/v1/chat/completions", json=body,
                              headers={"x-session-id": self.session}, timeout=120)
        assert response.status_code == 200, response.text
        data = response.json()
        content = data["choices"][0]["message"]["content"]
        self.messages.append({"role": "assistant", "content": content})
        h = response.headers
        return Turn(h["x-ppd-route"], int(h["x-ppd-turn"]), h["x-ppd-decode"],
                    h.get("x-ppd-prefill"), content, data["usage"]["prompt_tokens"],
                    data["usage"]["completion_tokens"])
