"""`ppd replay --reset-prefix-cache`: every node's prefix cache emptied before the run, so
runs compared with each other all start cold (no turn-1 prompt left cached by the last run).

The nodes are the ones the target proxy lists in its /stats (`backends`); a target that is
not a ppd proxy is taken to be a node itself. Each gets vLLM's `POST /reset_prefix_cache`,
a dev-mode route (the server needs VLLM_SERVER_DEV_MODE=1; `ppd cluster up` sets it on
loopback nodes, and emulated nodes always serve it). vLLM answers `{"success": false}` while
blocks are still held (a request running, KV a D has not pulled yet, or a finished turn's KV a
D keeps for a readback - vLLM's decoder_kv_blocks_ttl, which no reset releases): that is
retried for a while, then reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from proxy.shared.redact import redacted_url

RETRY_FOR_S = 20.0  # P holds a finished prompt's KV until D pulls it (or its lease ends)
RETRY_EVERY_S = 0.5


class PrefixResetError(RuntimeError):
    """A node did not reset its prefix cache; the message says which and why."""


def nodes_behind(client: httpx.Client, target: str) -> list[str]:
    """The node URLs of a ppd proxy at `target` (its /stats backends), else [target]."""
    try:
        response = client.get(f"{target}/stats")
        backends = response.json().get("backends") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        backends = None
    if not isinstance(backends, list):
        return [target]
    return [str(node["url"]).rstrip("/") for node in backends
            if isinstance(node, dict) and node.get("url")]


def reset_prefix_caches(target: str, *, timeout_s: float = 10.0,
                        retry_for_s: float = RETRY_FOR_S,
                        sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Reset the prefix cache of every node behind `target`; the node URLs reset.
    PrefixResetError names the first node that refused, and why."""
    with httpx.Client(timeout=timeout_s) as client:
        nodes = nodes_behind(client, target)
        if not nodes:
            raise PrefixResetError(f"{redacted_url(target)} lists no nodes in /stats: nothing "
                                   "to reset")
        for node in nodes:
            _reset(client, node, retry_for_s, sleep)
    return nodes


def _reset(client: httpx.Client, node: str, retry_for_s: float,
           sleep: Callable[[float], None]) -> None:
    shown = redacted_url(node)
    deadline = time.monotonic() + retry_for_s
    while True:
        try:
            response = client.post(f"{node}/reset_prefix_cache")
        except httpx.HTTPError as exc:
            raise PrefixResetError(f"node {shown}: cannot reset its prefix cache: "
                                   f"{type(exc).__name__}: {exc}") from None
        if response.status_code == 404:
            raise PrefixResetError(
                f"node {shown} has no POST /reset_prefix_cache (404): vLLM serves it only "
                "with VLLM_SERVER_DEV_MODE=1 in the server's environment (`ppd cluster up` "
                "sets it on nodes that listen on a loopback address); restart the node with "
                "it, or run without --reset-prefix-cache")
        if response.status_code != 200:
            raise PrefixResetError(f"node {shown} refused to reset its prefix cache: HTTP "
                                   f"{response.status_code} {response.text[:200]}")
        try:
            success = bool(response.json().get("success", True))
        except (ValueError, AttributeError):
            success = True  # an older vLLM answers 200 with no body
        if success:
            return
        if time.monotonic() >= deadline:
            raise PrefixResetError(
                f"node {shown} still holds KV blocks after {retry_for_s:g} s, so its prefix "
                "cache was not reset: requests are running, KV a decode node has not pulled, "
                "or - on a NIXL cluster with KV readback on - a decode node keeps each "
                "finished turn's KV for the readback TTL (vLLM's decoder_kv_blocks_ttl, "
                "480 s by default). Wait for the cluster to be idle, or start it with "
                "`ppd cluster up --no-kv-readback` (or a short --kv-readback-ttl) to compare "
                "cold runs")
        sleep(RETRY_EVERY_S)
