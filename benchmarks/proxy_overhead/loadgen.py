"""The closed-loop load generator, in its own process: one JSON job per stdin line.

    python -m benchmarks.proxy_overhead.loadgen   # then write jobs, read one result per job

A job `{"url", "concurrency", "turns", "duration", "warmup", "tokens"}` runs `concurrency`
workers, each holding one streamed chat request open at a time; a worker runs conversations of
`turns` turns, every turn resending the whole history plus the streamed reply (so a proxy sees
continuations it can serve locally). Each conversation opens with its own first user message,
so each is a new session. Requests finishing inside [warmup, warmup + duration] count; the
result gives requests/s, TTFT (first body byte) and inter-chunk gap percentiles in ms, and
errors (non-200, a broken stream, or a reply without `[DONE]`) over the whole job.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import uvloop

SYSTEM_PROMPT = "You are a helpful assistant. " * 8
QUESTION = "Tell me something about the number {n}, with a short example. " * 3


@dataclass(slots=True)
class Tally:
    """What the workers measured."""

    window_start: float
    window_end: float
    done: int = 0  # requests finished in the whole job (warm-up included)
    counted: int = 0  # requests finished inside the window
    errors: int = 0
    first_error: str = ""
    ttft: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)

    def error(self, what: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or what


def _reply_text(body: bytes) -> tuple[str, bool]:
    """The streamed reply's text and whether it ended with `[DONE]`."""
    parts, done = [], False
    for event in body.split(b"\n\n"):
        if not event.startswith(b"data: "):
            continue
        data = event[6:]
        if data == b"[DONE]":
            done = True
            continue
        for choice in json.loads(data).get("choices") or []:
            parts.append(choice.get("delta", {}).get("content") or "")
    return "".join(parts), done


async def _turn(session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]],
                tokens: int, tally: Tally) -> str | None:
    body = {"model": "bench-model", "messages": messages, "max_tokens": tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = last = 0.0
    gaps: list[float] = []
    chunks: list[bytes] = []
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                tally.error(f"status {response.status}: {(await response.read())[:200]!r}")
                return None
            async for chunk in response.content.iter_any():
                now = time.perf_counter()
                if first:
                    gaps.append(now - last)
                else:
                    first = now
                last = now
                chunks.append(chunk)
    except (aiohttp.ClientError, TimeoutError) as exc:
        tally.error(f"{type(exc).__name__}: {exc}")
        return None
    text, done = _reply_text(b"".join(chunks))
    if not done:
        tally.error("stream ended without [DONE]")
        return None
    tally.done += 1
    if started >= tally.window_start and last <= tally.window_end:
        tally.counted += 1
        tally.ttft.append(first - started)
        tally.gaps.extend(gaps)
    return text


async def _worker(session: aiohttp.ClientSession, url: str, turns: int, tokens: int,
                  tally: Tally) -> None:
    while time.perf_counter() < tally.window_end:
        opening = f"[{uuid.uuid4().hex}] " + QUESTION.format(n=1)
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": opening}]
        for n in range(turns):
            if time.perf_counter() >= tally.window_end:
                return
            reply = await _turn(session, url, messages, tokens, tally)
            if reply is None:
                await asyncio.sleep(0.01)  # an error: do not spin
                break
            messages = [*messages, {"role": "assistant", "content": reply},
                        {"role": "user", "content": QUESTION.format(n=n + 2)}]


def _ms(samples: list[float], q: float) -> float | None:
    return round(float(np.percentile(samples, q)) * 1000, 3) if samples else None


async def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Run one job; its measurements as plain data."""
    now = time.perf_counter()
    tally = Tally(now + job["warmup"], now + job["warmup"] + job["duration"])
    url = job["url"].rstrip("/") + "/v1/chat/completions"
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(_worker(session, url, job["turns"], job["tokens"], tally)
                               for _ in range(job["concurrency"])))
    return {"requests": tally.counted, "requests_total": tally.done,
            "rps": round(tally.counted / job["duration"], 1),
            "ttft_p50_ms": _ms(tally.ttft, 50), "ttft_p99_ms": _ms(tally.ttft, 99),
            "gap_p99_ms": _ms(tally.gaps, 99), "errors": tally.errors,
            "first_error": tally.first_error}


async def _serve_jobs() -> None:
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        result = await run_job(json.loads(line))
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


def main() -> int:
    uvloop.run(_serve_jobs())
    return 0


if __name__ == "__main__":
    sys.exit(main())
