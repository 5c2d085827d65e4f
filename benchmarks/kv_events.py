"""KV-event floods: how long one batch blocks the proxy's event loop, and what memory it keeps.

    python -m benchmarks.kv_events [--only NAME] [--timeout S]

Each flood is what a hostile or buggy publisher can send (issue "Trust, third pass";
docs/robustness.md, "KV events"), encoded as vLLM encodes it and handled by the proxy's own
code path: `parse_message` then `NodeSubscriber.handle`, one batch at a time, on an asyncio
loop beside a probe task that only yields. The probe's longest wait is the longest the loop
was blocked - what a request (or /stats) would have waited. Floods:

- self-parent: one session-tagged BlockStored whose block is its own parent;
- 2-block cycle: two untagged blocks, each the other's parent, then a tagged child;
- 20k chain: 20,000 single-block events extending one session's chain, a batch each;
- 1M random: 1,000,000 untagged blocks with random 32-byte hashes (vLLM's sha256 digests),
  1,000 per batch;
- 2k forks: the 20k chain, then 2,000 sessions each forking one block from its tip.

Each runs in its own process (its RSS is its own), under an address-space cap of
--memory-cap-mb and a wall-clock --timeout: a flood that hangs or swells is reported as such.
RSS growth is the process's resident memory after the flood less before it (the encoded
payloads are built first); peak is the most it reached. Numbers are for this machine; the
bounds are: loop block a few ms per batch, RSS growth under 200 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

FLOODS = ("self-parent", "2-block cycle", "20k chain", "1M random", "2k forks")
BLOCK = 16


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _batches(flood: str) -> list[bytes]:
    """The flood's payloads, as vLLM's publisher encodes them."""
    from proxy.live.kv_events import BlockStored, KvEvent, encode_batch

    def stored(blocks: list[Any], parent: Any, session: str | None) -> BlockStored:
        return BlockStored(tuple(blocks), parent, len(blocks) * BLOCK, BLOCK, session)

    def one(*events: KvEvent) -> bytes:
        return encode_batch(0.0, list(events))

    if flood == "self-parent":
        return [one(stored([b"s" * 32], b"s" * 32, "victim"))]
    if flood == "2-block cycle":
        a, b = b"a" * 32, b"b" * 32
        return [one(stored([a], b, None)), one(stored([b], a, None)),
                one(stored([b"c" * 32], a, "victim"))]
    chain = [one(stored([0], None, "chain"))]
    chain += [one(stored([i], i - 1, "chain")) for i in range(1, 20_000)]
    if flood == "20k chain":
        return chain
    if flood == "2k forks":
        return chain + [one(stored([1_000_000 + i], 19_999, f"fork{i}")) for i in range(2_000)]
    if flood == "1M random":
        return [encode_batch(0.0, [stored([os.urandom(32)], None, None) for _ in range(1_000)])
                for _ in range(1_000)]
    raise ValueError(f"unknown flood {flood!r}")


async def _handle_all(batches: list[bytes]) -> dict[str, Any]:
    from proxy.live.kv_events import encode_seq, parse_message
    from proxy.live.kv_subscriber import KvEventSource, NodeSubscriber
    from proxy.live.residency import NodeResidency

    index = NodeResidency()
    subscriber = NodeSubscriber(KvEventSource("http://bench-d", "tcp://127.0.0.1:1"), index)
    gaps: list[float] = []
    finished = False

    async def probe() -> None:  # the request path: it runs whenever the loop is free
        last = time.perf_counter()
        while not finished:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    rss_before = _rss_bytes()
    task = asyncio.create_task(probe())
    await asyncio.sleep(0)
    started = time.perf_counter()
    for seq, payload in enumerate(batches):
        # What KvEventSubscribers' receive loop does per message.
        batch = parse_message([b"kv", encode_seq(seq), payload])
        await subscriber.handle(batch, None)  # type: ignore[arg-type]  # no replay socket
        await asyncio.sleep(0)
    elapsed = time.perf_counter() - started
    finished = True
    await task
    gaps.sort()
    rejected = getattr(index, "rejected", {})
    return {
        "batches": len(batches),
        "seconds": elapsed,
        "max_block_ms": 1000 * gaps[-1],
        "p99_block_ms": 1000 * gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))],
        "rss_growth_mb": (_rss_bytes() - rss_before) / 2**20,
        "peak_growth_mb": max(0, _peak_rss_bytes() - rss_before) / 2**20,
        "rejected": sum(rejected.values()) if rejected else 0,
        "blocks": index.num_blocks,
    }


def child(flood: str, memory_cap_mb: int) -> None:
    """Run one flood in this process and print its result as JSON."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_cap_mb * 2**20, memory_cap_mb * 2**20))
    batches = _batches(flood)
    try:
        result = asyncio.run(_handle_all(batches))
    except MemoryError:
        result = {"error": f"out of memory (> {memory_cap_mb} MB address space)"}
    print(json.dumps(result))


def run_flood(flood: str, timeout: float, memory_cap_mb: int) -> dict[str, Any]:
    """One flood in a child process (this interpreter, the same sys.path)."""
    command = [sys.executable, "-m", "benchmarks.kv_events", "--child", flood,
               "--memory-cap-mb", str(memory_cap_mb)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"still blocked after {timeout:.0f} s (killed)"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail[:60]}"}
    return dict(json.loads(lines[-1]))


def render(results: list[tuple[str, dict[str, Any]]]) -> str:
    """The floods as a table."""
    header = (f"{'flood':<14}  {'batches':>8}  {'total s':>8}  {'max block ms':>12}  "
              f"{'p99 block ms':>12}  {'RSS growth MB':>13}  {'peak MB':>8}  {'rejected':>8}")
    lines = [header, "-" * len(header)]
    for flood, r in results:
        if "error" in r:
            lines.append(f"{flood:<14}  {r['error']}")
            continue
        lines.append(f"{flood:<14}  {r['batches']:>8}  {r['seconds']:>8.2f}  "
                     f"{r['max_block_ms']:>12.2f}  {r['p99_block_ms']:>12.3f}  "
                     f"{r['rss_growth_mb']:>13.1f}  {r['peak_growth_mb']:>8.1f}  "
                     f"{r['rejected']:>8}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kv-timeout", type=float, default=120.0,
                        help="kv_events: seconds a flood may take before it counts as a hang")
    parser.add_argument("--kv-memory-cap-mb", type=int, default=2500,
                        help="kv_events: address-space cap of each flood's process, MB")


def run(args: argparse.Namespace, floods: tuple[str, ...] = FLOODS,
        echo: Callable[[str], None] = print) -> int:
    echo(f"ppd KV-event floods - {platform.processor() or platform.machine()}, Python "
         f"{platform.python_version()}; per batch: parse + NodeSubscriber.handle")
    results = [(flood, run_flood(flood, args.kv_timeout, args.kv_memory_cap_mb))
               for flood in floods]
    echo(render(results))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kv_events", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=FLOODS, help="run this flood only")
    parser.add_argument("--child", choices=FLOODS, help=argparse.SUPPRESS)
    parser.add_argument("--memory-cap-mb", type=int, default=2500, help=argparse.SUPPRESS)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.memory_cap_mb)
        return 0
    return run(args, (args.only,) if args.only else FLOODS)


if __name__ == "__main__":
    sys.exit(main())
