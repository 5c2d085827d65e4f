"""Per-request cost of PPD's decision, side by side with forwarding a request.

Rows (one run, same machine, same moment):
- classify + lookup + policy: `RoutingPolicy.decide` under policy ppd on a full table
  (2 context classes x 9 shapes x 3 qps points), for random turn-2 workloads;
- policy live: `RoutingPolicy.decide` under policy live for random workloads and cluster
  states; the residency lookup it is handed (a 9k-token session) and the background cost of
  one KV event batch (decode + index), which the proxy pays per published batch;
- the reply capture and SSE framing of one streamed 16-token chat reply, fed as vLLM writes
  it (one event per chunk): what the relay pays per streamed request besides moving bytes;
- token counting of a turn's new messages with the model's tokenizer (proxy.shared.tokens, text-v1)
  (the other per-request cost of an exact decision);
- a whole non-streamed chat request through the proxy (pd: P leg + D leg; local: D leg) to
  in-process fake vLLM nodes, and the same request sent straight to a fake node: the
  difference is the proxy's forwarding overhead, which the decision is compared with.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from proxy import ProxyConfig, create_app
from proxy.config.cluster_file import NodeSpec
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.live.kv_events import BlockStored, encode_batch, parse_batch
from proxy.live.predict import NodeState, StepCosts, TurnState
from proxy.live.residency import NodeResidency
from proxy.policies.routing import RoutingPolicy
from proxy.policies.table import TABLE_COLUMNS, DecisionTable
from proxy.serving.server import running
from proxy.shared.discretize import WORKLOAD_SHAPES, ContextClass
from proxy.shared.vocabulary import Role, Workload

QPS_POINTS = (0.5, 1.0, 2.0)


def synthetic_table(rng: random.Random) -> DecisionTable:
    """A full-grid table with random (plausible) measurements: the lookup cost does not
    depend on the values, only on the table's size."""
    rows = []
    for context in (ContextClass.SMALL, ContextClass.LARGE):
        for workload in WORKLOAD_SHAPES:
            for qps in QPS_POINTS:
                rows.append({
                    "context_class": context.value, "workload": workload, "qps": qps,
                    "pd_ttft_ms": rng.uniform(100, 900), "pd_tpot_ms": rng.uniform(40, 80),
                    "pd_success": 1.0, "local_ttft_ms": rng.uniform(50, 900),
                    "local_tpot_ms": rng.uniform(40, 90), "local_success": 1.0,
                    "n_requests": 50,
                })
    assert set(rows[0]) == set(TABLE_COLUMNS)
    return DecisionTable.from_rows(rows)


def time_calls(call: Callable[[], Any], n: int) -> np.ndarray:
    """Per-call wall time in microseconds."""
    samples = np.empty(n)
    clock = time.perf_counter_ns
    for i in range(n):
        start = clock()
        call()
        samples[i] = (clock() - start) / 1000
    return samples


def bench_decide(n: int, rng: random.Random) -> np.ndarray:
    table = synthetic_table(rng)
    policy = RoutingPolicy(PolicyConfig(kind=Policy.PPD, table=Path("bench.csv")), table)
    workloads = [
        Workload(turn=rng.randint(2, 8), n_in=rng.randint(1, 2048), n_ctx=rng.randint(0, 6000),
                 n_out=rng.randint(1, 2048), qps=rng.uniform(0, 3))
        for _ in range(1024)
    ]
    index = iter(range(n))
    return time_calls(lambda: policy.decide(workloads[next(index) % 1024], "s", True), n)


# The decision's cost does not depend on the coefficients' values: round numbers of the size
# `ppd sim live-costs` fits to h100:llama-3.1-8b (ms per step, per token, per request).
BENCH_COSTS = StepCosts(base_ms=6.0, per_prefill_token_ms=0.017, per_decode_seq_ms=0.013,
                        per_decode_kv_ktoken_ms=0.04, per_prefill_attention_ms=0.0008,
                        transfer_ms_per_ktoken=0.29)


def bench_live(n: int, rng: random.Random) -> np.ndarray:
    """Policy live for random turn-2 workloads and cluster states (residency, batches)."""
    policy = RoutingPolicy(PolicyConfig(kind=Policy.LIVE), costs=BENCH_COSTS)
    cases = []
    for _ in range(1024):
        n_ctx = rng.randint(0, 9000)
        workload = Workload(turn=rng.randint(2, 8), n_in=rng.randint(1, 2048), n_ctx=n_ctx,
                            n_out=rng.randint(1, 2048), qps=rng.uniform(0, 20))
        decode = NodeState(rng.uniform(0, 256), rng.uniform(0, 8),
                           rng.choice([None, n_ctx, rng.randint(0, n_ctx)]), 16)
        prefill = NodeState(rng.uniform(0, 8), rng.uniform(0, 8), rng.randint(0, n_ctx), 16)
        cases.append((workload, TurnState(decode, prefill)))
    index = iter(range(n))

    def decide() -> None:
        workload, state = cases[next(index) % 1024]
        policy.decide(workload, "s", True, state)

    return time_calls(decide, n)


def bench_residency(n: int) -> tuple[np.ndarray, np.ndarray]:
    """A session's held tokens on a node (a 9,216-token history = 576 blocks of 16), and one
    published batch of 32 stored blocks decoded and folded into the index."""
    node = NodeResidency()
    blocks = [i.to_bytes(32, "big") for i in range(576)]
    node.apply(BlockStored(tuple(blocks), None, 576 * 16, 16, "s"))
    lookups = time_calls(lambda: node.held_tokens("s"), n)
    payloads = []
    for batch in range(1024):
        hashes = tuple((10_000 + batch * 32 + i).to_bytes(32, "big") for i in range(32))
        payloads.append(encode_batch(0.0, [BlockStored(hashes, None, 32 * 16, 16,
                                                       f"s{batch}")]))
    index = iter(range(n))

    def apply() -> None:
        i = next(index)
        for event in parse_batch(i, payloads[i % 1024]).events:
            node.apply(event)

    return lookups, time_calls(apply, n)


def bench_tokens(n: int, tokenizer_dir: Path | None) -> np.ndarray | None:
    if tokenizer_dir is None:
        return None
    from proxy.shared.tokens import new_input_tokens, token_counter

    counter = token_counter(tokenizer_dir)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "proxy", "turns"]
    rng = random.Random(1)
    question = " ".join(rng.choice(words) for _ in range(100))  # ~ a mid_bal turn
    body = {"messages": [{"role": "user", "content": question}]}
    return time_calls(lambda: new_input_tokens(counter, body, 0, chat=True), n)


async def bench_requests(n: int) -> dict[str, np.ndarray]:
    """Sequential non-streamed chat requests: direct to a fake node, and through the proxy."""
    from tests.fakes.fake_vllm import FakeVLLM

    body = {"model": "fake-model", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hello there, how are you?"}]}
    out: dict[str, np.ndarray] = {}
    async with FakeVLLM("p") as p, FakeVLLM("d") as d:
        nodes = (NodeSpec(p.url, Role.PREFILL), NodeSpec(d.url, Role.DECODE))
        async with httpx.AsyncClient(timeout=30) as client:
            await _timed_posts(client, f"{d.url}/v1/chat/completions", lambda i: body, 10)
            out["direct to a vLLM node (fake)"] = await _timed_posts(
                client, f"{d.url}/v1/chat/completions", lambda i: body, n)
            for policy in (Policy.PD, Policy.LOCAL):
                config = ProxyConfig(nodes=nodes, policy=PolicyConfig(kind=policy), port=0)
                async with running(create_app(config)) as server:
                    url = f"{server.url}/v1/chat/completions"
                    # Each sample is turn 2 of its own conversation: turn 1 is sent first,
                    # untimed, so the timed request exercises the policy's turn-2 route.
                    samples = []
                    for i in range(n):
                        first = {**body, "conversation_id": f"{policy}-{i}"}
                        reply = (await client.post(url, json=first)).json()
                        text = reply["choices"][0]["message"]["content"]
                        second = {**first, "messages": [
                            *body["messages"], {"role": "assistant", "content": text},
                            {"role": "user", "content": "and then?"}]}
                        timed = await _timed_posts(client, url, lambda _, b=second: b, 1)
                        samples.append(float(timed[0]))
                    label = ("through proxy, route pd (P leg + D leg)" if policy is Policy.PD
                             else "through proxy, route local (D leg)")
                    out[label] = np.array(samples)
    return out


async def _timed_posts(client: httpx.AsyncClient, url: str,
                       body_for: Callable[[int], dict[str, Any]], n: int) -> np.ndarray:
    samples = np.empty(n)
    for i in range(n):
        start = time.perf_counter_ns()
        response = await client.post(url, json=body_for(i))
        response.read()
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}: {response.text}")
        samples[i] = (time.perf_counter_ns() - start) / 1000
    return samples


def bench_capture(n: int) -> np.ndarray:
    """Frame and capture one 16-token streamed reply, chunk by chunk, as the relay does."""
    from benchmarks.proxy_overhead.backend import stream_events
    from proxy.shared.completion import ReplyCapture
    from proxy.upstream.relay import SseFramer, _split_before_done

    chunks = stream_events(16, True)

    def relay_one() -> None:
        framer, capture = SseFramer(), ReplyCapture(stream=True)
        for chunk in chunks:
            _, done = _split_before_done(framer.feed(chunk))
            capture.feed(chunk)
            if done:
                assert capture.stream_done
        capture.finish()

    return time_calls(relay_one, n)


def run(n_decide: int = 20_000, n_requests: int = 200) -> list[tuple[str, np.ndarray]]:
    """All rows of this benchmark, as (label, samples in microseconds)."""
    rng = random.Random(0)
    rows = [("classify + table lookup + ppd policy", bench_decide(n_decide, rng)),
            ("live policy: predict both routes + score", bench_live(n_decide, rng))]
    lookup, apply = bench_residency(n_decide // 4)
    rows += [("residency: held tokens of a 9k-token session", lookup),
             ("KV events: decode + index a 32-block batch", apply)]
    rows.append(("frame + capture a streamed 16-token reply", bench_capture(n_decide // 4)))
    tokenizer_dir = _tiny_tokenizer()
    tokens = bench_tokens(n_decide // 4, tokenizer_dir)
    if tokens is not None:
        rows.append(("count a ~100-word turn (HF tokenizer)", tokens))
    rows += list(asyncio.run(bench_requests(n_requests)).items())
    return rows


def _tiny_tokenizer() -> Path | None:
    """The tiny model's tokenizer (built locally in seconds) for the token-counting row."""
    try:
        from profiler.models.prepare import prepare_model

        return prepare_model("tiny")
    except Exception as exc:  # the row is optional; say why it is missing
        print(f"(token counting row skipped: cannot prepare the tiny model: {exc})")
        return None


