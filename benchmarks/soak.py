"""`python -m benchmarks.soak` (`make soak`): many concurrent streaming conversations through a
real `ppd proxy` process against fast fake nodes in a third process, in identical rounds.

Each conversation is one user: its own connection, 2-4 streamed turns (each turn carries the
whole history), then it hangs up and the next user takes its place, until the round ends.
Reported per round: requests, lost (an error, or a stream without `[DONE]`), hung (no answer
within --request-timeout), req/s, and after the round the proxy's RSS, open descriptors, sockets
in CLOSE-WAIT on its port, and its in-flight gauges from /metrics (which must be back to 0).
Flat RSS and descriptors between identical rounds mean nothing leaks.

`--serve-fakes` is the fake-node process itself (prints its node URLs as one JSON line).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from proxy.policies import fixed as fixed_policy

ROOT = Path(__file__).resolve().parents[1]
TCP_CLOSE_WAIT = "08"


@dataclass
class RoundResult:
    """What one round of conversations saw."""

    requests: int = 0
    lost: int = 0
    hung: int = 0
    conversations: int = 0
    seconds: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class Probe:
    """The proxy process as seen from outside, and its in-flight gauges."""

    rss_mib: float
    fds: int
    close_wait: int
    in_flight: float  # ppd_requests_in_flight plus every ppd_node_in_flight


# ---- processes ----------------------------------------------------------------------------

def _python_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def fake_nodes(names: tuple[str, ...] = ("p1", "d1", "d2"),
               chunk_delay_s: float = 0.0) -> Iterator[dict[str, str]]:
    """Fake vLLM nodes in a child process (streams wait chunk_delay_s per chunk); {name: url}."""
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.soak", "--serve-fakes",
                             ",".join(names), "--fake-chunk-delay", str(chunk_delay_s)],
                            stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                            env=_python_env(), cwd=ROOT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the fake-node process did not start")
        yield json.loads(line)
    finally:
        _stop(proc)


@contextlib.contextmanager
def proxy_process(urls: dict[str, str], *extra: str,
                  log: Path | None = None) -> Iterator[tuple[str, int]]:
    """`ppd proxy` over the fakes in a child process (its log to `log`); (url, pid) once up."""
    port = _free_port()
    nodes = [arg for name, url in urls.items()
             for arg in (f"--{'prefill' if name[0] == 'p' else 'decode'}", url)]
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from proxy.cli import main; "
                             "sys.exit(main(sys.argv[1:]))", *nodes, "--port", str(port),
                             "--policy", fixed_policy.NAME, "--x", "0.5", *extra],
                            env=_python_env(), cwd=ROOT,
                            stderr=open(log, "ab") if log else subprocess.DEVNULL)  # noqa: SIM115
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the proxy exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            raise TimeoutError("the proxy did not become healthy")
        yield url, proc.pid
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _serve_fakes(names: list[str], chunk_delay_s: float) -> None:
    from tests.fakes.fake_vllm import FakeVLLM  # the fakes' process only

    async with contextlib.AsyncExitStack() as stack:
        urls = {name: (await stack.enter_async_context(
            FakeVLLM(name, chunk_delay_s=chunk_delay_s))).url for name in names}
        print(json.dumps(urls), flush=True)
        # Until the parent closes stdin (or signals).
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


# ---- load -------------------------------------------------------------------------------------

async def _conversation(url: str, user: int, timeout: float, result: RoundResult) -> None:
    history: list[dict[str, str]] = [{"role": "system", "content": "You are a soak test."}]
    limits = httpx.Limits(max_connections=1)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        for turn in range(random.randint(2, 4)):
            history.append({"role": "user", "content": f"user {user} turn {turn} " * 8})
            body = {"model": "fake-model", "messages": history, "max_tokens": 8, "stream": True}
            try:
                text = await _stream_turn(client, body)
            except httpx.TimeoutException:
                result.hung += 1
                return
            except (httpx.HTTPError, ValueError) as exc:
                result.lost += 1
                kind = f"{type(exc).__name__}: {str(exc)[:70]}"
                result.errors[kind] = result.errors.get(kind, 0) + 1
                return
            finally:
                result.requests += 1
            history.append({"role": "assistant", "content": text})
    result.conversations += 1


async def _stream_turn(client: httpx.AsyncClient, body: dict[str, object]) -> str:
    parts: list[str] = []
    done = False
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            error = json.loads(await response.aread()).get("error", {})
            raise ValueError(f"status {response.status_code} {error.get('code')}")
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    raise ValueError(f"error event: {event['error']}")
                for choice in event.get("choices", []):
                    parts.append((choice.get("delta") or {}).get("content") or "")
    if not done:
        raise ValueError("stream ended without [DONE]")
    return "".join(parts)


async def run_round(url: str, clients: int, seconds: float,
                    request_timeout: float = 30.0) -> RoundResult:
    """`clients` users at once for `seconds`; each finishes its conversation at the end."""
    result = RoundResult()
    started = time.monotonic()
    end = started + seconds
    next_user = iter(range(10**9))

    async def user_slot() -> None:
        while True:  # at least one conversation per slot, however late the slot starts
            await _conversation(url, next(next_user), request_timeout, result)
            if time.monotonic() >= end:
                return

    await asyncio.gather(*(user_slot() for _ in range(clients)))
    result.seconds = time.monotonic() - started
    return result


# ---- probes -----------------------------------------------------------------------------------

def close_wait_on_port(port: int) -> int:
    """Sockets in CLOSE-WAIT whose local port is `port` (IPv4 and IPv6)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == TCP_CLOSE_WAIT and int(local.rsplit(":", 1)[1], 16) == port:
                    count += 1
    return count


def probe(url: str, pid: int) -> Probe:
    """RSS, descriptors and CLOSE-WAIT sockets of the proxy process, and its gauges."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    close_wait = close_wait_on_port(int(url.rsplit(":", 1)[1]))  # before our own connection
    exposition = httpx.get(f"{url}/metrics", timeout=5).text
    gauges = re.findall(r"^ppd_(?:requests|node)_in_flight(?:\{.*\})? (\S+)$", exposition, re.M)
    return Probe(rss_kib / 1024, fds, close_wait, sum(float(g) for g in gauges))


# ---- report -----------------------------------------------------------------------------------

def soak(clients: int, seconds: float, rounds: int, settle: float, request_timeout: float,
         log: Path | None = None) -> list[tuple[RoundResult, Probe, Probe]]:
    """Run the rounds; per round its result, a probe right after it and one after `settle`."""
    rows = []
    with fake_nodes() as urls, proxy_process(urls, log=log) as (url, pid):
        rows_probe = probe(url, pid)
        print(f"start: RSS {rows_probe.rss_mib:.0f} MiB, fds {rows_probe.fds}", flush=True)
        for _ in range(rounds):
            result = asyncio.run(run_round(url, clients, seconds, request_timeout))
            right_after = probe(url, pid)
            time.sleep(settle)
            rows.append((result, right_after, probe(url, pid)))
    return rows


def render(rows: list[tuple[RoundResult, Probe, Probe]], settle: float) -> str:
    head = (f"{'round':>5} {'requests':>8} {'lost':>5} {'hung':>5} {'req/s':>7} "
            f"{'RSS MiB':>8} {'fds':>5} {'CLOSE-WAIT':>10} {'in flight':>9} | after {settle:.0f} s:"
            f" {'fds':>5} {'CLOSE-WAIT':>10}")
    lines = [head, "-" * len(head)]
    for i, (r, after, settled) in enumerate(rows, 1):
        lines.append(f"{i:>5} {r.requests:>8} {r.lost:>5} {r.hung:>5} {r.rate:>7.1f} "
                     f"{after.rss_mib:>8.1f} {after.fds:>5} {after.close_wait:>10} "
                     f"{after.in_flight:>9.0f} | {'':>{len(str(int(settle))) + 9}}"
                     f"{settled.fds:>5} {settled.close_wait:>10}")
        if r.errors:
            lines.append(f"      errors: {r.errors}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--clients", type=int, default=500, help="concurrent conversations")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of a round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settle", type=float, default=7.0,
                        help="idle seconds before the second probe (past the keep-alive)")
    parser.add_argument("--request-timeout", type=float, default=60.0,
                        help="a request without its answer after this long counts as hung")
    parser.add_argument("--proxy-log", type=Path, help="append the proxy's log here")
    parser.add_argument("--serve-fakes", metavar="NAMES", help=argparse.SUPPRESS)
    parser.add_argument("--fake-chunk-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_fakes:
        asyncio.run(_serve_fakes(args.serve_fakes.split(","), args.fake_chunk_delay))
        return 0
    print(f"soak: {args.clients} concurrent streaming conversations, {args.rounds} x "
          f"{args.seconds:.0f} s, ppd proxy (policy fixed 0.5) over 1 P + 2 D fakes", flush=True)
    rows = soak(args.clients, args.seconds, args.rounds, args.settle, args.request_timeout,
                args.proxy_log)
    print(render(rows, args.settle))
    bad = any(r.lost or r.hung or after.in_flight for r, after, _ in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
