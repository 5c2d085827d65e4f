"""`--policy dynamo`: NVIDIA Dynamo's conditional disaggregation (`--router-conditional-disagg`,
policy `isl_bounding`, its defaults) over its KV router's worker choice.

Sources (ai-dynamo/dynamo, 2026): `lib/kv-router/src/conditional_disagg.rs` (088ca50:
`IslBoundingPolicy`, DEFAULT_CONDITIONAL_DISAGG_EFF_ISL_THRESHOLD 2048 and _RATIO_THRESHOLD
0.7), `lib/llm/src/kv_router/prefill_router/conditional_bypass.rs` (07a6c9c) and the router
design docs (docs.nvidia.com/dynamo, "Router Design": the KV router's cost):
- the router peeks at the decode worker its KV router would pick: the lowest cost
  `overlap_score_weight` (1.0) x potential prefill blocks (the prompt's tokens it has not
  cached / block size) + potential decode blocks (the blocks its requests hold - ppd reads
  vLLM's KV usage - plus this prompt's, the same on every worker);
- `isl_bounding` bypasses P - the decode worker prefills locally - iff on that worker
  eff_isl = prompt - cached < 2048 AND eff_isl / prompt < 0.7 (both strict: 2047 of 10,000
  bypasses, 2048 does not; a prompt 70% uncached does not). The optional decode-busy gate is
  off by default, and so here;
- otherwise the request is disaggregated: its prefill worker is the prefill pool's lowest KV
  cost (the same formula; ppd's P cache is the approximate estimate of `anchor_nodes`), and
  its decode leg is routed with `overlap_score_weight = 0` (`build_decode_router_override`):
  the least loaded decode worker by active blocks, whatever it caches.
A bypass on the session's own D is ppd's local route; on another D (one that also holds the
history) it runs P->D there.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.live.cluster_view import ClusterView, NodeView
from proxy.policies.anchor_nodes import (
    anchored,
    block_size,
    cached_tokens,
    cheapest,
    prompt_tokens,
    usable,
    used_blocks,
)
from proxy.policies.base import Inputs, Needs, Turn
from proxy.shared.vocabulary import Decision, Role, Workload

NAME = "dynamo"
NEEDS = Needs(view=True)

OVERLAP_SCORE_WEIGHT = 1.0
EFF_ISL_THRESHOLD = 2048
EFF_ISL_RATIO_THRESHOLD = 0.7


def kv_cost(node: NodeView, view: ClusterView, workload: Workload,
            overlap_weight: float = OVERLAP_SCORE_WEIGHT) -> float:
    """The KV router's cost of a worker, in blocks: weighted prefill blocks + decode blocks."""
    size = block_size(node)
    cached = cached_tokens(node, view, workload) // size * size  # whole blocks only
    prefill_blocks = (prompt_tokens(workload) - cached) / size
    return overlap_weight * prefill_blocks + used_blocks(node)


def pick(nodes: Sequence[NodeView], view: ClusterView, workload: Workload,
         overlap_weight: float = OVERLAP_SCORE_WEIGHT) -> NodeView | None:
    """The KV router's choice: the lowest cost (temperature 0)."""
    return cheapest(nodes, lambda n: kv_cost(n, view, workload, overlap_weight))


def bypasses(prompt: int, eff_isl: int) -> bool:
    """isl_bounding: local prefill iff eff_isl < 2048 and eff_isl / prompt < 0.7."""
    if eff_isl >= EFF_ISL_THRESHOLD:
        return False
    return eff_isl / max(prompt, 1) < EFF_ISL_RATIO_THRESHOLD


def decide(turn: Turn, inputs: Inputs) -> Decision:
    """The bypass on the KV router's decode worker, else P->D on the cheapest P and the least
    loaded D."""
    view = turn.view or ClusterView(())
    workload = turn.workload
    decodes = usable(view, Role.DECODE)
    peeked = pick(decodes, view, workload)
    if peeked is not None:
        size = block_size(peeked)
        eff_isl = prompt_tokens(workload) - cached_tokens(peeked, view, workload) // size * size
    else:
        eff_isl = workload.n_in
    if workload.turn > 1 and bypasses(prompt_tokens(workload), eff_isl):
        return anchored(turn, peeked, None, skip_prefill=True)
    prefill = pick(usable(view, Role.PREFILL), view, workload)
    decode = pick(decodes, view, workload, overlap_weight=0.0)
    return anchored(turn, decode, prefill, skip_prefill=False)

