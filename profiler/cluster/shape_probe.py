"""What a node's prefill step costs by shape, timed by the node itself (`ppd cluster probe`).

Replay runs cannot separate a prompt's per-token cost from its attention over earlier context:
in a workload the tokens a turn computes and the context they attend to grow together. This
probe varies them apart on an otherwise idle node, one request at a time (max_tokens 1, prompts
of random token ids, so no tokenizer and no cache hit between requests):
- **cold**: a prompt of N tokens, nothing cached (N tokens computed, no context);
- **hit**: the same prompt again (vLLM recomputes its last block over the rest);
- **append**: the prompt plus `append` new tokens (an append-prefill after N cached tokens);
- **text**: a prompt of random words about N/4 long, as text: the node tokenizes it, so the
  request's time outside the engine (client time - queue - prefill) shows the front end's
  per-token part;
- **chat-via-proxy** (`probe_frontend`, when the cluster runs a proxy): the same kind of text
  as the second turn of a chat session through the proxy, forced onto its D (`x-ppd-route:
  local`) and timed by that D's counters: the front end a replayed turn meets, the proxy's
  own per-token work (parsing the body, counting the prompt's tokens) and the chat template
  included;
- **busy-text** (`probe_busy`, `--busy`): text prompts sent to a D while it decodes other
  requests (long streams kept running through the proxy, as a replay's are): what a request
  waits outside the engine for each request the node is running. The node's API server
  streams every running request's tokens on one event loop, and on a CPU node it shares the
  engine's core; each row records the node's `vllm:num_requests_running` as it was sent.

Each request's step time is the node's own `vllm:request_prefill_time_seconds` (the change in
its sum across the request); the tokens it computed come from the node's prompt and prefix-cache
counters, not from assumptions about its block size. `ppd sim calibrate --probe FILE` fits the
prefill step's constant, per-token and attention terms on the rows.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from proxy.shared.vocabulary import RouteKind

DEFAULT_LENGTHS = (128, 512, 1024, 2048, 3072)
DEFAULT_APPEND = 256
DEFAULT_REPEATS = 5
# requests kept decoding on the node while busy-text runs (0: the same prompts, idle)
DEFAULT_BUSY = (0, 4, 12, 24)
BUSY_LENGTHS = (256, 2048)  # busy-text prompt lengths (tokens, about)
BUSY_OUTPUT = 2000  # tokens each background stream asks for: it outlasts a level's probes
BUSY_SETTLE_S = 30.0  # longest wait for the background streams to be running
PROBE_FILE = "probe.csv"
# Token ids drawn from here: above the special tokens of small vocabularies, inside any.
_FIRST_ID, _LAST_ID = 10, 3000


class ProbeError(Exception):
    """The node cannot be probed; the message says why."""


@dataclass(frozen=True, slots=True)
class ProbeRow:
    node: str  # the node whose counters timed it
    kind: str  # cold, hit, append, text or chat-via-proxy
    prompt_tokens: int  # from the node's counters
    computed_tokens: int  # prompt - prefix-cache hits, from the node's counters
    prefill_ms: float  # the node's vllm:request_prefill_time_seconds for this request
    queue_ms: float  # its vllm:request_queue_time_seconds
    client_ms: float  # the request as the probe saw it (HTTP, front end, queue, the step)
    running: int = 0  # requests the node was running as it was sent (busy-text; else idle)


def probe_node(url: str, *, lengths: Sequence[int] = DEFAULT_LENGTHS,
               append: int = DEFAULT_APPEND, repeats: int = DEFAULT_REPEATS,
               max_model_len: int = 4096, seed: int | None = None, timeout_s: float = 120.0,
               transport: httpx.BaseTransport | None = None) -> list[ProbeRow]:
    """Probe one vLLM node (base URL, without /v1); it should serve nothing else meanwhile.
    Prompts are drawn afresh on every run (seed None): a prompt an earlier probe sent would
    hit the node's prefix cache and no longer be cold."""
    usable = [n for n in lengths if n > 0 and n + append < max_model_len]
    if not usable:
        raise ProbeError(f"no prompt length fits --max-model-len {max_model_len} with "
                         f"{append} appended tokens: give shorter --lengths")
    rng = random.Random(seed)
    rows: list[ProbeRow] = []
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s,
                      transport=transport) as client:
        model = _served_model(client)
        for _ in range(repeats):
            for length in usable:
                prompt = [rng.randint(_FIRST_ID, _LAST_ID) for _ in range(length)]
                extra = [rng.randint(_FIRST_ID, _LAST_ID) for _ in range(append)]
                rows.append(_timed(client, model, "cold", prompt))
                rows.append(_timed(client, model, "hit", prompt))
                if append:
                    rows.append(_timed(client, model, "append", prompt + extra))
                words = " ".join(_word(rng) for _ in range(max(length // 4, 1)))
                rows.append(_timed(client, model, "text", words))
    return rows


def probe_frontend(node_url: str, proxy_url: str, *, admin_key: str | None = None,
                   lengths: Sequence[int] = DEFAULT_LENGTHS, repeats: int = DEFAULT_REPEATS,
                   seed: int | None = None, timeout_s: float = 120.0,
                   transport: httpx.BaseTransport | None = None) -> list[ProbeRow]:
    """Text prompts as second chat turns through the proxy, forced local onto the D at
    node_url and timed by that D's counters. Each session opens with a short first turn
    (which the proxy sends P->D: a turn 1 has no D of its own yet), so the measured turn runs
    on the D that holds it, as a replayed turn 2 does."""
    rng = random.Random(seed)
    nonce = rng.getrandbits(32)  # sessions of an earlier probe are not reused
    auth = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
    rows: list[ProbeRow] = []
    with httpx.Client(base_url=node_url.rstrip("/"), timeout=timeout_s,
                      transport=transport) as node, \
            httpx.Client(base_url=proxy_url.rstrip("/"), timeout=timeout_s,
                         transport=transport, headers=auth) as proxy:
        model = _served_model(node)
        for repeat in range(repeats):
            for length in lengths:
                session = f"ppd-probe-{nonce:08x}-{repeat}-{length}"
                opening = [{"role": "user", "content": _word(rng)}]
                first = proxy.post("/v1/chat/completions", headers={"x-session-id": session},
                                   json={"model": model, "max_tokens": 1,
                                         "messages": opening})
                if first.status_code != 200:
                    raise ProbeError(f"{proxy.base_url}: the probe's first turn answered "
                                     f"{first.status_code}: {first.text[:300]}")
                reply = first.json()["choices"][0]["message"].get("content") or ""
                history = [*opening, {"role": "assistant", "content": reply}]
                words = " ".join(_word(rng) for _ in range(max(length // 4, 1)))
                rows.append(_timed(node, model, "chat-via-proxy", words, via=proxy,
                                   session=session, history=history))
    return rows


def probe_busy(node_url: str, *, via_url: str | None = None, admin_key: str | None = None,
               levels: Sequence[int] = DEFAULT_BUSY, lengths: Sequence[int] = BUSY_LENGTHS,
               repeats: int = DEFAULT_REPEATS, seed: int | None = None,
               timeout_s: float = 120.0, settle_s: float = BUSY_SETTLE_S,
               transport: httpx.BaseTransport | None = None) -> list[ProbeRow]:
    """Text prompts to the node at node_url while `level` long requests decode on it, for
    each level: the background streams go through `via_url` (the cluster's proxy, forced
    local, so the proxy relays them as it relays a replay's) or straight to the node. A row is
    kept only when its request was the only one to finish meanwhile (the node's prefill-time
    histogram counts requests as they finish)."""
    rng = random.Random(seed)
    rows: list[ProbeRow] = []
    with httpx.Client(base_url=node_url.rstrip("/"), timeout=timeout_s,
                      transport=transport) as node:
        model = _served_model(node)
        for level in levels:
            with _background_streams(via_url or node_url, model, level, admin_key,
                                     timeout_s, transport):
                _wait_running(node, level, settle_s)
                for _ in range(repeats):
                    for length in lengths:
                        words = " ".join(_word(rng) for _ in range(max(length // 4, 1)))
                        running = int(_counters(node).get("num_requests_running", 0.0))
                        row, finished = _timed_counted(node, model, "busy-text", words)
                        if finished == 1:
                            rows.append(ProbeRow(**{**asdict(row), "running": running}))
    return rows


@contextlib.contextmanager
def _background_streams(url: str, model: str, count: int, admin_key: str | None,
                        timeout_s: float, transport: httpx.BaseTransport | None):
    """`count` threads, each keeping one long streamed request running until the block ends
    (a finished one is replaced)."""
    stop = threading.Event()
    headers = {"x-ppd-route": RouteKind.LOCAL.value,
               **({"authorization": f"Bearer {admin_key}"} if admin_key else {})}

    def stream() -> None:
        with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s, transport=transport,
                          headers=headers) as client:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError), client.stream(
                        "POST", "/v1/chat/completions", json={
                            "model": model, "max_tokens": BUSY_OUTPUT, "ignore_eos": True,
                            "stream": True,
                            "messages": [{"role": "user", "content": "count slowly"}]},
                ) as response:
                    for _ in response.iter_lines():
                        if stop.is_set():
                            break
                stop.wait(0.05)  # a request that ended at once (an error) is not retried hot

    threads = [threading.Thread(target=stream, daemon=True, name=f"probe-busy-{i}")
               for i in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=timeout_s)


def _wait_running(node: httpx.Client, level: int, settle_s: float) -> None:
    deadline = time.monotonic() + settle_s
    while _counters(node).get("num_requests_running", 0.0) < level:
        if time.monotonic() > deadline:
            return  # the node runs fewer at once (max_num_seqs): rows record what it ran
        time.sleep(0.1)


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))


def write_probe(rows: Sequence[ProbeRow], out: Path) -> Path:
    import pandas as pd  # writing only: `ppd cluster --help` does not pay for pandas

    out.mkdir(parents=True, exist_ok=True)
    path = out / PROBE_FILE
    pd.DataFrame([asdict(row) for row in rows]).to_csv(path, index=False)
    return path


def _served_model(client: httpx.Client) -> str:
    try:
        response = client.get("/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise ProbeError(f"{client.base_url}: no model list at /v1/models ({exc}); is it a "
                         "vLLM server?") from exc


def _counters(client: httpx.Client) -> dict[str, float]:
    from profiler.engine.calibrate import parse_metrics  # pandas, numpy: probing only

    response = client.get("/metrics")
    response.raise_for_status()
    values = parse_metrics(response.text)
    if "request_prefill_time_seconds_sum" not in values:
        raise ProbeError(f"{client.base_url}/metrics has no vllm:request_prefill_time_seconds "
                         "(a vLLM v1 server exports it)")
    return values


def _timed(client: httpx.Client, model: str, kind: str, prompt: list[int] | str, *,
           via: httpx.Client | None = None, session: str = "",
           history: Sequence[dict[str, str]] = ()) -> ProbeRow:
    """One request, timed by the counters of `client`'s node: sent to that node, or through
    `via` (a proxy) as the next chat turn of `session`, forced local."""
    return _timed_counted(client, model, kind, prompt, via=via, session=session,
                          history=history)[0]


def _timed_counted(client: httpx.Client, model: str, kind: str, prompt: list[int] | str, *,
                   via: httpx.Client | None = None, session: str = "",
                   history: Sequence[dict[str, str]] = ()) -> tuple[ProbeRow, int]:
    """`_timed`, and how many requests finished on the node meanwhile (its row is this
    request's alone when that is 1)."""
    before = _counters(client)
    started = time.perf_counter()
    if via is None:
        response = client.post("/v1/completions", json={
            "model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0})
    else:
        response = via.post(
            "/v1/chat/completions", headers={"x-session-id": session,
                                             "x-ppd-route": RouteKind.LOCAL.value},
            json={"model": model, "max_tokens": 1, "temperature": 0,
                  "messages": [*history, {"role": "user", "content": prompt}]})
    client_ms = (time.perf_counter() - started) * 1000
    if via is not None and "x-ppd-route-ignored" in response.headers:
        raise ProbeError(f"{via.base_url} ignored the forced route: it has no admin key. "
                         "Start the proxy with --admin-key K and pass --admin-key K here")
    if response.status_code != 200:
        target = (via or client).base_url
        raise ProbeError(f"{target}: a {kind} prompt of {len(prompt)} "
                         f"{'characters' if isinstance(prompt, str) else 'tokens'} answered "
                         f"{response.status_code}: {response.text[:300]}")
    after = _counters(client)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    computed = (delta("prompt_tokens_total") - delta("prefix_cache_hits_total")
                - delta("external_prefix_cache_hits_total"))
    row = ProbeRow(str(client.base_url), kind, int(round(delta("prompt_tokens_total"))),
                   int(round(computed)), delta("request_prefill_time_seconds_sum") * 1000,
                   delta("request_queue_time_seconds_sum") * 1000, client_ms)
    return row, int(round(delta("request_prefill_time_seconds_count")))
