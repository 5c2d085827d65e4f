"""`--policy llm-d-sticky`: llm-d's "sticky until saturated" routing - a request stays on the
pods that cache most of its prompt until they are saturated - with llm-d's P-skip at 16.

Sources: llm-d/llm-d-router's `prefix-cache-affinity-filter` and `token-load-scorer`
(`pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/README.md`, llm-d-router
655726d, 2026; the composition of llm-d's `guides/optimized-baseline`, default since v1.0, and
of its P/D guide's prefill profile), the blog post "Sticky Until Saturated: Token-Aware
Routing in llm-d", and the decider of `proxy.policies.llm_d`. Defaults as shipped:
- sticky: a pod whose prefix score (cached share of the prompt) is at least
  `affinityThreshold` 0.80 is warm; with no warm pod every pod stays in play;
- saturated, as the filter defines it: each pod's TTFT is estimated as its in-flight tokens
  / `peakPrefillThroughput` (15,928 tokens/s, llm-d's default, calibrated on Qwen-32B on two
  H100s); when the best warm pod's estimate exceeds the best cold pod's by more than
  `maxTTFTPenaltyMs` 18,000 ms - an in-flight gap over 286,704 tokens - stickiness breaks and
  every pod is scored (equality stays sticky). `explorationProbability` is 0 (its default);
- `token-load-scorer` + `max-score-picker` then take the pod with the fewest tokens to
  process: its in-flight tokens plus this prompt's tokens it has not cached.
ppd's in-flight tokens of a node are the KV tokens it uses now (vLLM's kv_cache_usage_perc),
the tokens its running requests hold; unknown gauges count as 0. Decode pods and prefill pods
are each picked so (P by the approximate P cache, `anchor_nodes`); P is skipped, as in
`llm-d`, when the chosen D lacks fewer than 16 of the prompt's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.live.cluster_view import ClusterView, NodeView
from proxy.policies.anchor_nodes import (
    cheapest,
    uncached_tokens,
    used_tokens,
)
from proxy.policies.base import Inputs, Needs, Turn
from proxy.policies.llm_d import decide_with, prefix_score
from proxy.shared.vocabulary import Decision, Workload

NAME = "llm-d-sticky"
NEEDS = Needs(view=True)

AFFINITY_THRESHOLD = 0.80
PEAK_PREFILL_TOKENS_PER_S = 15928.0
MAX_TTFT_PENALTY_MS = 18000.0
# The gate in tokens: the in-flight gap the TTFT penalty stands for.
SATURATION_TOKENS = PEAK_PREFILL_TOKENS_PER_S * MAX_TTFT_PENALTY_MS / 1000.0


def sticky_set(nodes: Sequence[NodeView], view: ClusterView,
               workload: Workload) -> tuple[NodeView, ...]:
    """prefix-cache-affinity-filter: the warm pods, unless none is warm or the warm ones are
    saturated (then every pod)."""
    warm = tuple(n for n in nodes if prefix_score(n, view, workload) >= AFFINITY_THRESHOLD)
    cold = tuple(n for n in nodes if n not in warm)
    if not warm or not cold:
        return tuple(nodes)
    gap = min(used_tokens(n) for n in warm) - min(used_tokens(n) for n in cold)
    return tuple(nodes) if gap > SATURATION_TOKENS else warm


def pick(nodes: Sequence[NodeView], view: ClusterView, workload: Workload) -> NodeView | None:
    """The filter, then token-load-scorer's pick: fewest in-flight + uncached tokens."""
    return cheapest(sticky_set(nodes, view, workload),
                    lambda n: used_tokens(n) + uncached_tokens(n, view, workload))


def decide(turn: Turn, inputs: Inputs) -> Decision:
    """Sticky until saturated on each role; P skipped under 16 uncached tokens on the D."""
    return decide_with(turn, pick)
