"""`--policy vllm-router`: the vLLM project's Rust router in P/D mode with `consistent_hash` on
the session, plus the KV-event prefill bypass of its open PR #130 at <= 256 uncached tokens.

Sources: vllm-project/router `src/policies/consistent_hash.rs` (080589a) and
`docs/load_balancing/README.md`: each worker is placed on a hash ring at 160 virtual nodes
(`"{url}:{i}"`); a request goes to the first point at or after its key's hash, wrapping
around; the key is the session (`X-Session-ID` first; ppd's session id, which a client's
`x-session-id` or `conversation_id` names). Prefill and decode pools each hash the key on
their own ring (`--prefill-policy consistent_hash --decode-policy consistent_hash`).
PR #130 ("KV events-aware precise cache routing for P/D disaggregation", open, 2026-03;
`src/policies/kv_aware.rs` at 71af994) subscribes to vLLM's KV events and lets a request
skip the prefill stage when its decode worker already caches enough of the prompt; issue #43
states its bar: at most 256 tokens of the prompt not cached there (256 runs on D alone, 257
goes P->D).
Deviations, each without effect while every node is up: the ring's points are blake2b, not
mcrouter's furc/murmur hash (the same ring, other positions), and the ring holds the usable
nodes only - vllm-router sends a session whose node is down to the first healthy worker,
ppd to the next point of the ring.
"""

from __future__ import annotations

import bisect
import functools
import hashlib

from proxy.live.cluster_view import ClusterView, NodeView
from proxy.policies.anchor_nodes import anchored, uncached_tokens, usable
from proxy.policies.base import Inputs, Needs, Turn
from proxy.shared.vocabulary import Decision, Role

NAME = "vllm-router"
NEEDS = Needs(view=True)

VIRTUAL_NODES = 160
BYPASS_UNCACHED_TOKENS = 256


def _point(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=64)
def _ring(urls: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The ring of these nodes: sorted points, and the node at each (built once per set)."""
    points = sorted((_point(f"{url}:{i}"), url) for url in urls for i in range(VIRTUAL_NODES))
    return tuple(p for p, _ in points), tuple(u for _, u in points)


def ring_pick(nodes: tuple[NodeView, ...], key: str) -> NodeView | None:
    """The node at the first ring point at or after the key's hash (wrapping around)."""
    if not nodes:
        return None
    points, owners = _ring(tuple(sorted(node.url for node in nodes)))
    index = bisect.bisect_left(points, _point(key)) % len(points)
    return next(node for node in nodes if node.url == owners[index])


def skips_prefill(uncached: int) -> bool:
    """PR #130's bypass: the decode worker prefills itself at <= 256 uncached tokens."""
    return uncached <= BYPASS_UNCACHED_TOKENS


def decide(turn: Turn, inputs: Inputs) -> Decision:
    """The session's D and P by consistent hashing; P skipped at <= 256 uncached tokens."""
    view = turn.view or ClusterView(())
    decode = ring_pick(usable(view, Role.DECODE), turn.session_id)
    prefill = ring_pick(usable(view, Role.PREFILL), turn.session_id)
    uncached = (uncached_tokens(decode, view, turn.workload) if decode is not None
                else turn.workload.n_in)
    return anchored(turn, decode, prefill, skips_prefill(uncached))
