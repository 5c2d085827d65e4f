"""`--policy llm-d`: llm-d's P/D rule - a decode pod picked by prefix cache and queue, and P
skipped when that pod lacks fewer than 16 of the prompt's tokens.

Source: llm-d/llm-d-inference-scheduler (now llm-d/llm-d-router) at 520af47 (2026-05-17,
v0.8.0+), `deploy/config/pd-epp-config.yaml` - the sample P/D configuration - read with
`pkg/epp/framework/plugins/scheduling/profilehandler/disagg/prefix_based_pd_decider.go`,
`scorer/prefix/plugin.go` and `scorer/queuedepth/queue.go`:
- the `disagg-profile-handler` runs the decode profile first: `decode-filter`, then
  `prefix-cache-scorer` (weight 2) + `queue-scorer` (weight 1), `max-score-picker`. The prefix
  score is the matched share of the prompt (matched blocks / prompt blocks); the queue score
  (max_waiting - waiting) / (max_waiting - min_waiting) over the candidates, 1 for all when
  every queue is equal. As issue #43 asks, the prefix scorer is llm-d's precise one (vLLM's
  KV events: ppd's residency) rather than the sample's approximate one;
- `prefix-based-pd-decider` with `nonCachedTokens: 16` then runs the prefill profile only
  when the prompt's tokens the chosen decode pod has not cached number at least 16 (the
  source's `nonCachedTokens < threshold` skips P: 15 uncached runs on D alone, 16 goes P->D).
  llm-d estimates the prompt's length as its JSON's characters / 4; ppd counts tokens;
- the prefill profile scores the P pods the same way (prefix x2, queue x1). ppd sees no P's
  KV events, so a P's prefix is the approximate indexer's estimate (`anchor_nodes`).
Skipping P on the session's own D is ppd's local route; skipping it on another D (one that
happens to hold the history) runs P->D there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proxy.live.cluster_view import ClusterView, NodeView
from proxy.policies.anchor_nodes import (
    anchored,
    best,
    cached_tokens,
    prompt_tokens,
    uncached_tokens,
    usable,
)
from proxy.policies.base import Inputs, Needs, Turn
from proxy.shared.vocabulary import Decision, Role, Workload

NAME = "llm-d"
NEEDS = Needs(view=True)

# pd-epp-config.yaml's weights and its decider's threshold.
PREFIX_WEIGHT = 2.0
QUEUE_WEIGHT = 1.0
NON_CACHED_TOKENS = 16


def prefix_score(node: NodeView, view: ClusterView, workload: Workload) -> float:
    """The share of the prompt the node caches (prefix-cache-scorer), in [0, 1]."""
    prompt = prompt_tokens(workload)
    return cached_tokens(node, view, workload) / prompt if prompt > 0 else 0.0


def queue_scores(nodes: Sequence[NodeView]) -> Callable[[NodeView], float]:
    """queue-scorer over the candidates: 1 for the shortest waiting queue, 0 for the longest,
    1 for all when they are equal (an unknown queue counts as empty)."""
    waits = [node.waiting or 0.0 for node in nodes]
    low, high = min(waits, default=0.0), max(waits, default=0.0)
    if high == low:
        return lambda node: 1.0
    return lambda node: (high - (node.waiting or 0.0)) / (high - low)


def pick(nodes: Sequence[NodeView], view: ClusterView, workload: Workload) -> NodeView | None:
    """The max-score pick of one profile: prefix x2 + queue x1."""
    queue = queue_scores(nodes)
    return best(nodes, lambda node: PREFIX_WEIGHT * prefix_score(node, view, workload)
                + QUEUE_WEIGHT * queue(node))


def skips_prefill(uncached: int) -> bool:
    """prefix-based-pd-decider: no prefill profile while the uncached suffix is under 16."""
    return uncached < NON_CACHED_TOKENS


Pick = Callable[[Sequence[NodeView], ClusterView, Workload], NodeView | None]


def decide_with(turn: Turn, pick: Pick) -> Decision:
    """llm-d's P/D decision with a profile's pick: each role's pod, then P skipped when the
    prompt's uncached suffix on the picked D is under 16 tokens (llm-d-sticky shares it)."""
    view = turn.view or ClusterView(())
    workload = turn.workload
    decode = pick(usable(view, Role.DECODE), view, workload)
    prefill = pick(usable(view, Role.PREFILL), view, workload)
    uncached = (uncached_tokens(decode, view, workload) if decode is not None
                else workload.n_in)
    return anchored(turn, decode, prefill, skips_prefill(uncached))


def decide(turn: Turn, inputs: Inputs) -> Decision:
    """Decode pod by prefix and queue, P skipped under 16 uncached tokens there."""
    return decide_with(turn, pick)
