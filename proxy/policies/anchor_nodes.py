"""What the anchor policies (llm-d, llm-d-sticky, dynamo, vllm-router, vllm-example) read of a
node in `Turn.view`, each the way the router it stands for reads it (docs/anchor-policies.md).

A turn's prompt is the history D holds plus the new tokens (n_ctx + n_in). What a node's
prefix cache holds of it:
- a D (or R): residency from its KV events (`NodeView.held_tokens`, vLLM's own reports, as
  llm-d's precise prefix-cache scorer, Dynamo's KV router and vllm-router's kv_aware policy
  read them). Where residency does not know the session (no KV events for it), the session's
  own D is taken to hold what the session ledger says (n_ctx), every other D nothing -
  `proxy.policies.live` makes the same assumption;
- a P: ppd subscribes to no P's KV events, so a P's cache is estimated as an approximate
  indexer estimates it (llm-d's `approx-prefix-cache-producer`, Dynamo's `--no-kv-events`
  mode): the P that served the session's last turn holds its history, the others nothing.

Ties between equal scores go to the pool's order (fewest in flight, then fewest picks): the
routers break them at random (llm-d's max-score picker) or by worker key (Dynamo); a
deterministic order keeps a simulation reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from proxy.live.cluster_view import ClusterView, NodeView
from proxy.policies.base import Turn
from proxy.shared.vocabulary import Decision, Reason, Role, RouteKind, Workload

# vLLM's default --block-size, for a node whose events have not said theirs.
DEFAULT_BLOCK_SIZE = 16


def prompt_tokens(workload: Workload) -> int:
    """The turn's whole prompt: the history D holds and the new tokens."""
    return workload.n_ctx + workload.n_in


def cached_tokens(node: NodeView, view: ClusterView, workload: Workload) -> int:
    """Leading tokens of the turn's prompt the node's prefix cache holds (see the module
    docstring for where residency is silent, and for P nodes)."""
    prompt = prompt_tokens(workload)
    if node.role is Role.PREFILL:
        return min(workload.n_ctx, prompt) if node.url == view.home_prefill else 0
    if node.held_tokens is not None:
        return min(node.held_tokens, prompt)
    return min(workload.n_ctx, prompt) if node.url == view.home_decode else 0


def uncached_tokens(node: NodeView, view: ClusterView, workload: Workload) -> int:
    """Tokens of the prompt the node would have to compute."""
    return prompt_tokens(workload) - cached_tokens(node, view, workload)


def block_size(node: NodeView) -> int:
    """The node's KV block size in tokens (vLLM's default when it has not said)."""
    return node.kv_block_size or DEFAULT_BLOCK_SIZE


def used_blocks(node: NodeView) -> float:
    """KV blocks in use now (vLLM's kv_cache_usage_perc x its blocks); 0 when the gauges are
    not known (the node then weighs nothing on this count)."""
    if node.kv_usage is None or node.kv_blocks is None:
        return 0.0
    return node.kv_usage * node.kv_blocks


def used_tokens(node: NodeView) -> float:
    """KV tokens in use now: the requests the node holds (0 when not known)."""
    return used_blocks(node) * block_size(node)


def pool_order(node: NodeView) -> tuple[int, int]:
    """The pool's own tie-breaker: fewest in flight, then fewest picks."""
    return node.in_flight, node.picks


def best(nodes: Iterable[NodeView], score: Callable[[NodeView], float]) -> NodeView | None:
    """The node with the highest score, ties to the pool's order (None: no node)."""
    return max(nodes, key=lambda n: (score(n), tuple(-k for k in pool_order(n))), default=None)


def cheapest(nodes: Iterable[NodeView], cost: Callable[[NodeView], float]) -> NodeView | None:
    """The node with the lowest cost, ties to the pool's order (None: no node)."""
    return min(nodes, key=lambda n: (cost(n), pool_order(n)), default=None)


def usable(view: ClusterView | None, role: Role) -> tuple[NodeView, ...]:
    """The usable nodes of a role (none without a view)."""
    return view.usable(role) if view is not None else ()


def url(node: NodeView | None) -> str | None:
    """A chosen node's URL for `Decision.decode` / `prefill` (None: the pool's default)."""
    return node.url if node is not None else None


def anchored(turn: Turn, decode: NodeView | None, prefill: NodeView | None,
             skip_prefill: bool) -> Decision:
    """An anchor rule's verdict on the nodes it chose: turn 1 and a turn without a usable home
    go P->D; a turn whose prefill the rule skips runs locally when the D it chose is the
    session's own (ppd appends only on the D that holds the history), else P->D on that D -
    whose own prefix cache still spares it the pull of what it holds."""
    decode_url, prefill_url = url(decode), url(prefill)
    if turn.workload.turn <= 1:
        return Decision(RouteKind.PD, Reason.TURN1, decode=decode_url, prefill=prefill_url)
    if not turn.can_local:
        return Decision(RouteKind.PD, Reason.NO_HOME, decode=decode_url, prefill=prefill_url)
    home = turn.view.home_decode if turn.view is not None else None
    if skip_prefill and (decode is None or decode.url == home):
        return Decision(RouteKind.LOCAL, Reason.THRESHOLD, decode=decode_url,
                        prefill=prefill_url)
    return Decision(RouteKind.PD, Reason.THRESHOLD, decode=decode_url, prefill=prefill_url)
