"""`ppd register`: send a node's heartbeats to a proxy's discovery socket (ZMQ DEALER).

Formats (see proxy.discovery): ppd's own `{"type": ROLE, "url": URL, "models": [...]}`, or with
`--legacy` the P2pNccl one `{"type": "P"|"D", "http_address": "host:port",
"zmq_address": "host:port"}`. Heartbeats go every `--interval` seconds (3, like vLLM's
P2pNccl nodes) until interrupted, or `--count` times.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import msgpack
import zmq

from proxy.route import Role

_LEGACY_TYPES = {Role.PREFILL: "P", Role.DECODE: "D"}


def build_parser() -> argparse.ArgumentParser:
    """The `ppd register` argument parser."""
    p = argparse.ArgumentParser(prog="ppd register", description=__doc__.splitlines()[0])
    p.add_argument("--proxy", required=True, metavar="tcp://HOST:PORT",
                   help="the proxy's --discovery address")
    p.add_argument("--role", required=True, choices=[r.value for r in Role])
    p.add_argument("--url", required=True, help="the node's base URL, e.g. http://127.0.0.1:8100")
    p.add_argument("--model", action="append", default=[], help="a model the node serves")
    p.add_argument("--interval", type=float, default=3.0, help="seconds between heartbeats")
    p.add_argument("--count", type=int, default=0, help="send this many and stop (0: forever)")
    p.add_argument("--legacy", action="store_true", help="P2pNccl format (prefill/decode only)")
    p.add_argument("--zmq-address", help="legacy: the node's own KV-transfer ZMQ host:port")
    return p


def heartbeat(role: Role, url: str, models: list[str], legacy: bool = False,
              zmq_address: str | None = None) -> dict[str, Any]:
    """The heartbeat map for a node."""
    if not legacy:
        return {"type": role.value, "url": url, "models": models}
    if role not in _LEGACY_TYPES:
        raise ValueError("the legacy format knows only prefill and decode nodes")
    parts = urlsplit(url)
    if not parts.hostname or not parts.port:
        raise ValueError(f"--url must carry host and port for the legacy format: {url!r}")
    http_address = f"{parts.hostname}:{parts.port}"
    return {"type": _LEGACY_TYPES[role], "http_address": http_address,
            "zmq_address": zmq_address or http_address}


def send_heartbeats(proxy: str, payload: dict[str, Any], interval: float, count: int = 0,
                    stop: threading.Event | None = None) -> int:
    """Send payload every interval seconds (count times, or until stop is set); the number sent."""
    if not proxy.startswith("tcp://"):
        raise ValueError(f"--proxy must look like tcp://HOST:PORT, got {proxy!r}")
    stop = stop or threading.Event()
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 1000)  # let the last heartbeat leave before closing
    sent = 0
    try:
        socket.connect(proxy)
        message = msgpack.packb(payload)
        while not stop.is_set() and (count <= 0 or sent < count):
            socket.send(message)
            sent += 1
            if count <= 0 or sent < count:
                stop.wait(interval)
    finally:
        socket.close()
        context.term()
    return sent


def main(argv: list[str]) -> int:
    """Send heartbeats until interrupted (or --count are sent)."""
    args = build_parser().parse_args(argv)
    if args.interval <= 0:
        raise ValueError("--interval must be > 0")
    if not args.url.startswith(("http://", "https://")):
        raise ValueError(f"--url must start with http:// or https://: {args.url!r}")
    payload = heartbeat(Role(args.role), args.url, args.model, args.legacy, args.zmq_address)
    started = time.monotonic()
    sent = send_heartbeats(args.proxy, payload, args.interval, args.count)
    print(f"sent {sent} heartbeat(s) to {args.proxy} in {time.monotonic() - started:.1f}s")
    return 0
