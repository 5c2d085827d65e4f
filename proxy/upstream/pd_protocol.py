"""vLLM's P/D wire protocol as pure functions (docs/architecture.md, "Wire protocol").

Bodies are built from the client's body and never mutate it, so every leg of a failover
retry starts from the original request. Only the proxy sets `kv_transfer_params`: a client's
own is dropped from every leg, since it would tell a node where to pull KV from (another
host, other blocks). D gets exactly what P returned, and nothing when P returned nothing.
"""

from __future__ import annotations

import os
from typing import Any

# What P needs to keep the prompt's KV for a remote D to read.
P_KV_TRANSFER_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
# Fields that would make P generate more than the one token a prefill needs.
_P_DROPPED = ("stream_options", "min_tokens", "min_completion_tokens")
# Fields only the proxy may set on a leg.
_PROXY_ONLY = ("kv_transfer_params",)


def _client_fields(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in _PROXY_ONLY}


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The P leg: one token, not streamed, asking P to keep the KV for a remote decode."""
    out = {k: v for k, v in _client_fields(body).items() if k not in _P_DROPPED}
    out["max_tokens"] = 1
    if "max_completion_tokens" in body:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out["kv_transfer_params"] = dict(P_KV_TRANSFER_PARAMS)
    return out


def decode_body(body: dict[str, Any], kv_transfer_params: Any) -> dict[str, Any]:
    """The D leg: the client's body plus P's kv_transfer_params when P returned some."""
    out = _client_fields(body)
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = kv_transfer_params
    return out


def local_body(body: dict[str, Any]) -> dict[str, Any]:
    """The local (append-prefill) and replica leg: the client's body, minus proxy-only fields."""
    return _client_fields(body)


def request_id(prefill_zmq: str | None = None, decode_zmq: str | None = None) -> str:
    """The X-Request-Id of one turn, in P2pNccl's legacy format when both nodes registered so.

    128 random bits in hex, as `uuid4().hex` has (122 of them) without building a UUID object
    (1.5% of the proxy's CPU)."""
    unique = os.urandom(16).hex()
    if prefill_zmq and decode_zmq:
        return f"___prefill_addr_{prefill_zmq}___decode_addr_{decode_zmq}_{unique}"
    return f"ppd-{unique}"
