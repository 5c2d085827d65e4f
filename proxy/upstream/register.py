"""`ppd register`: send a node's heartbeats to a proxy's discovery socket (ZMQ DEALER).

Formats (encoded and decoded in proxy.upstream.discovery): ppd's own
`{"type": ROLE, "url": URL, "models": [...]}`, or with `--legacy` the P2pNccl one
`{"type": "P"|"D", "http_address": "host:port", "zmq_address": "host:port"}`.
With `--token` (or $PPD_DISCOVERY_TOKEN) each heartbeat carries the proxy's discovery token,
in a ZMQ frame before the map (`proxy.upstream.discovery.heartbeat_frames`).
Heartbeats go every `--interval` seconds (3, like vLLM's P2pNccl nodes) until interrupted,
or `--count` times.
"""

from __future__ import annotations

import argparse
import os
import time

from proxy.shared.vocabulary import Role
from proxy.upstream.discovery import heartbeat, send_heartbeats

TOKEN_ENV = "PPD_DISCOVERY_TOKEN"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                     argparse.RawDescriptionHelpFormatter):
    """Defaults shown, the example kept as written."""


def build_parser() -> argparse.ArgumentParser:
    """The `ppd register` argument parser."""
    p = argparse.ArgumentParser(
        prog="ppd register", description=__doc__.splitlines()[0],
        formatter_class=_HelpFormatter,
        epilog="example:\n  ppd register --proxy tcp://127.0.0.1:30001 --role decode "
        "--url http://127.0.0.1:8200 --model tiny")
    p.add_argument("--proxy", required=True, metavar="tcp://HOST:PORT",
                   help="the proxy's --discovery address")
    p.add_argument("--role", required=True, choices=[r.value for r in Role])
    p.add_argument("--url", required=True, help="the node's base URL, e.g. http://127.0.0.1:8100")
    p.add_argument("--model", action="append", default=[], help="a model the node serves")
    p.add_argument("--interval", type=float, default=3.0, help="seconds between heartbeats")
    p.add_argument("--count", type=int, default=0, help="send this many and stop (0: forever)")
    p.add_argument("--legacy", action="store_true", help="P2pNccl format (prefill/decode only)")
    p.add_argument("--zmq-address", help="legacy: the node's own KV-transfer ZMQ host:port")
    # The default is read in main(), not here: help must never print the secret.
    p.add_argument("--token", metavar="T",
                   help=f"the proxy's --discovery-token (else ${TOKEN_ENV}, which is better: "
                   "flags show up in `ps`)")
    return p


def main(argv: list[str]) -> int:
    """Send heartbeats until interrupted (or --count are sent)."""
    args = build_parser().parse_args(argv)
    if args.interval <= 0:
        raise ValueError("--interval must be > 0")
    if not args.url.startswith(("http://", "https://")):
        raise ValueError(f"--url must start with http:// or https://: {args.url!r}")
    token = args.token or os.environ.get(TOKEN_ENV)
    payload = heartbeat(Role(args.role), args.url, args.model, args.legacy, args.zmq_address)
    started = time.monotonic()
    sent = send_heartbeats(args.proxy, payload, args.interval, args.count, token=token)
    print(f"sent {sent} heartbeat(s) to {args.proxy} in {time.monotonic() - started:.1f}s")
    return 0
