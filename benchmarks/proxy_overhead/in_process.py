"""ppd's own CPU per request, without sockets: the ASGI app over an in-memory transport.

    python -m benchmarks.proxy_overhead.in_process [--policy local] [--turns 4] \
        [--requests 3000] [--baseline TREE] [--profile]

The socket rows (runner.py) mix the proxy's work with the kernel's and the scheduler's; here
the app is called directly (streamed chat, the fake P/D answers of backend.py through
httpx.MockTransport) and the process CPU time per request is printed. With --baseline the
same measurement runs on another checkout, alternately, in fresh processes (the code under
test is imported from that tree). --profile prints cProfile's top functions instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _app(policy: str) -> Any:
    import httpx

    from benchmarks.proxy_overhead.backend import (
        MODEL,
        is_prefill_leg,
        prefill_answer,
        stream_events,
    )
    from proxy import create_app
    from proxy.config.settings import config_from_args
    from proxy.policies import registry
    from proxy.policies.base import Need

    events, prefilled = b"".join(stream_events(16, False)), prefill_answer()
    models = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    def node(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/health"):
            return httpx.Response(200)
        if request.url.path.endswith("/v1/models"):
            return httpx.Response(200, json=models)
        if is_prefill_leg(request.content):
            return httpx.Response(200, content=prefilled,
                                  headers={"content-type": "application/json"})
        return httpx.Response(200, content=events, headers={"content-type": "text/event-stream"})

    args = ["--prefill", "http://p.invalid:1", "--decode", "http://d.invalid:2",
            "--policy", policy, "--health-interval", "600"]
    if registry.get(policy).needs.table is Need.REQUIRED:
        args += ["--table", str(REPO / "tables" / "tiny-cpu-1p1d.csv")]
    return create_app(config_from_args(args), transport=httpx.MockTransport(node))


async def _request(app: Any, messages: list[dict[str, str]]) -> str:
    body = json.dumps({"model": "bench-model", "messages": messages, "stream": True,
                       "max_tokens": 16}).encode()
    inbox = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop()
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "query_string": b"", "http_version": "1.1", "scheme": "http", "root_path": "",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000)}
    await app(scope, receive, send)
    stream = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return "".join(json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                   for line in stream.decode().split("\n\n") if line.startswith("data: {"))


async def _conversation(app: Any, name: str, turns: int) -> None:
    messages = [{"role": "user", "content": f"conversation {name}: an opening of some words"}]
    for turn in range(turns):
        reply = await _request(app, messages)
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": f"follow-up {turn}, a few more words"}]


async def _measure(policy: str, turns: int, requests: int, profile: bool) -> float:
    logging.basicConfig(level=logging.INFO, stream=open(os.devnull, "w"))  # noqa: SIM115
    app = _app(policy)
    await app.startup()
    for i in range(50):  # warm-up
        await _conversation(app, f"warm-{i}", turns)
    profiler = cProfile.Profile() if profile else None
    start = time.process_time()
    if profiler:
        profiler.enable()
    for i in range(requests // turns):
        await _conversation(app, str(i), turns)
    if profiler:
        profiler.disable()
        stats = pstats.Stats(profiler).sort_stats(os.environ.get("PPD_PROFILE_SORT", "tottime"))
        stats.print_stats(int(os.environ.get("PPD_PROFILE_ROWS", "30")))
    spent = time.process_time() - start
    await app.shutdown()
    return 1e6 * spent / (requests // turns * turns)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.proxy_overhead import runner
    from proxy.policies import local as local_policy

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", choices=runner.POLICIES, default=local_policy.NAME)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, metavar="TREE")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)  # the child's import root
    args = parser.parse_args(argv)
    if args.tree is not None:
        sys.path.insert(0, str(args.tree))  # ppd (and the fake's answers) from that checkout
    if args.tree is not None or args.profile:
        print(f"{asyncio.run(_measure(args.policy, args.turns, args.requests, args.profile)):.1f}")
        return 0
    trees = {"this checkout": REPO} | ({"baseline": args.baseline.resolve()}
                                       if args.baseline else {})
    spent: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            child = subprocess.run(
                [sys.executable, "-m", "benchmarks.proxy_overhead.in_process", "--tree", str(tree),
                 "--policy", args.policy, "--turns", str(args.turns),
                 "--requests", str(args.requests)],
                cwd=tree, check=True, capture_output=True, text=True)
            spent[name].append(float(child.stdout.split()[-1]))
    print(f"policy {args.policy}, {args.turns}-turn conversations, {args.requests} requests, "
          "in process (no sockets): CPU microseconds per request")
    for name, values in spent.items():
        rounds = " ".join(f"{v:.0f}" for v in values)
        print(f"  {name:>14}: min {min(values):7.1f}  rounds {rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
