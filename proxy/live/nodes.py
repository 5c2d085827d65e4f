"""Which D a live turn decodes on, and which P prefills it: every usable node priced by
`proxy.live.predict`'s model (docs/live-routing.md, "Which D").

Pure, as `proxy.live.predict`: it reads `Turn.view` (`proxy.live.cluster_view`) and the step costs.

A P->D turn may decode on any D, not only the session's: one holding more of the prompt
pulls less of it, a lighter batch gives every request in it a shorter step, and a D without
room for the prompt cannot admit it until its running requests free blocks. So each usable D
is priced as the turn's P->D route to it (`_pd_ttft_ms`: the queue and step of its batch, the
pull of what its prefix cache lacks) and as the batch the conversation then decodes in
(`_joining`: its own TPOT and what it adds to the others), and the turn takes the best by the
decision table's own score (`LiveScorer`):
- a turn 2+: each D's P->D against local on the session's D (`moved`); a D other than the
  session's moves the conversation, which `LiveScorer` charges as a re-placement (the batch
  it leaves against the one it joins, for the turns it has left). The D scoring lowest is
  P->D's best, and local is taken only if it beats that D;
- turn 1 (and a turn whose D is gone): the D with the lowest w_ttft x TTFT / mean TTFT +
  w_tpot x membership / mean step - the same two terms, the placement weight 1.
Room: vLLM admits a request only with free blocks for its whole prompt (the history's
cached blocks are in the free pool too, so a local append needs as many). A D whose free KV
(1 - kv_cache_usage_perc of its capacity) is below the prompt is passed over while another
has room; local on such a D is ruled out the same way. A node whose gauges are unknown has
room (nothing says otherwise).
The P is the one with the least prefill work ahead (`least_prefill_work`: the KV its
admitted requests hold, plus its queue at this turn's size); ties to the pool's order.
Every count is the gauges' or the proxy's own in-flight count, whichever is more
(`node_state`): gauges lag a burst of decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from proxy.live.cluster_view import ClusterView, NodeView
from proxy.live.predict import (
    NodeState,
    Prediction,
    StepCosts,
    TurnState,
    _beside_batch,
    _has_room,
    _joining,
    _pd_ttft_ms,
)
from proxy.live.scorer import LiveScorer
from proxy.shared.vocabulary import Role, Workload

# vLLM's default --block-size, for a node whose events have not said theirs.
_BLOCK_SIZE = 16


def node_state(node: NodeView) -> NodeState:
    """What `proxy.live.predict` reads of a node, from its view (the batch's output lengths are not
    in a view: unknown). Requests the proxy has in flight there beyond what the gauges show
    (sent since the last scrape, or still in the node's API server) are counted too - on a
    D in the batch they will join, on a P in its queue: a burst of turns decided between
    two scrapes must not all see the same idle node."""
    free = None
    if node.kv_usage is not None and node.kv_tokens is not None:
        free = round((1.0 - node.kv_usage) * node.kv_tokens)
    running, waiting = node.busy, node.waiting or 0.0
    unseen = max(node.in_flight - running - waiting, 0.0)
    if node.role is Role.PREFILL:
        waiting += unseen
    else:
        running += unseen
    return NodeState(running, waiting, node.held_tokens, node.kv_block_size or _BLOCK_SIZE,
                     None, free)


def prompt_tokens(workload: Workload) -> int:
    return workload.n_ctx + workload.n_in


def roomy(nodes: Sequence[NodeView], tokens: int) -> tuple[NodeView, ...]:
    """The nodes with room for `tokens` of new KV now; all of them when none has."""
    fit = tuple(node for node in nodes if _has_room(node_state(node), tokens))
    return fit or tuple(nodes)


def moved(workload: Workload, state: TurnState, base: Prediction, other: NodeState,
          costs: StepCosts) -> Prediction:
    """A turn 2+'s prediction with P->D decoding on `other` instead of the session's D:
    P->D's TTFT to it (its batch, the pull of what it lacks), and the two batches the
    conversation would decode in - local's (the session's D) and P->D's (`other`) - for
    `LiveScorer` to charge the move."""
    n_ctx, prompt = workload.n_ctx, prompt_tokens(workload)
    held = min(other.held_tokens or 0, n_ctx)
    ttft = _pd_ttft_ms(workload, TurnState(other, state.prefill), n_ctx, costs, d_held=held)
    return replace(base, ttft_pd_ms=ttft,
                   joins_local=_joining(state.decode, prompt, workload.n_out, costs),
                   joins_pd=_joining(other, prompt, workload.n_out, costs))


def placement_cost(workload: Workload, decode: NodeState, prefill: NodeState,
                   costs: StepCosts, scorer: LiveScorer, refs: tuple[float, float]) -> float:
    """A homeless turn's P->D to one D, in the table's units: w_ttft x its TTFT over the
    mean P->D TTFT + w_tpot x the batch it joins (`LiveScorer.membership_ms`) over the mean
    step (`refs`: those two means)."""
    prompt = prompt_tokens(workload)
    held = min(decode.held_tokens or 0, prompt)
    ttft = _pd_ttft_ms(workload, TurnState(decode, prefill), prompt, costs, d_held=held)
    joined = scorer.membership_ms(_joining(decode, prompt, workload.n_out, costs))
    ttft_ref, step_ref = refs
    return scorer.w_ttft * ttft / ttft_ref + scorer.w_tpot * joined / step_ref


def placement_decode(workload: Workload, view: ClusterView, prefill: NodeState,
                     costs: StepCosts, scorer: LiveScorer) -> NodeView | None:
    """The D a homeless turn's P->D decodes on (None: no usable D)."""
    decodes = roomy(view.usable(Role.DECODE), prompt_tokens(workload))
    if not decodes:
        return None
    prompt = prompt_tokens(workload)
    # The scorer's means, else (its first turns) this turn's own on the first D.
    first = node_state(decodes[0])
    ttft_ref = scorer.ttft_pd_first_ms or _pd_ttft_ms(
        workload, TurnState(first, prefill), prompt, costs)
    step_ref = scorer.step_ms or costs.step_ms(0, 0, first.running + 1,
                                               (first.running + 1) * prompt)
    refs = (max(ttft_ref, 1e-9), max(step_ref, 1e-9))
    return min(decodes, key=lambda node: (
        placement_cost(workload, node_state(node), prefill, costs, scorer, refs),
        node.in_flight, node.picks))


def least_prefill_work(view: ClusterView, prompt: int) -> NodeView | None:
    """The usable P with the least prefill work ahead of this turn's: the KV tokens its
    admitted requests hold (vLLM's kv_cache_usage_perc x its capacity) plus its queue
    (waiting, and what the proxy sent that the gauges do not show yet), each queued request
    taken to be this turn's size, as P->D's TTFT takes it; without KV gauges every request
    counts so (None: no usable P). Requests differ a hundredfold in length in production
    traffic, so a count alone says little of the wait."""
    def work(node: NodeView) -> float:
        state = node_state(node)
        if node.kv_usage is None or node.kv_tokens is None:
            return (state.running + state.waiting) * prompt
        return node.kv_usage * node.kv_tokens + state.waiting * prompt

    return min(view.usable(Role.PREFILL), key=lambda n: (work(n), n.in_flight, n.picks),
               default=None)


def arrivals_delayed(workload: Workload, view: ClusterView, base: Prediction) -> Prediction:
    """`base` with the turns that reach the session's D during local's longer step counted
    in its queue delay: the proxy's turns arrive at `workload.qps`, spread over the usable
    Ds; the step lasts the decode step + delta, and one arriving during it waits delta / 2
    longer on average for D's next step (Poisson arrivals). A D shared by few others' turns
    (many Ds, a light load) makes this small; a scarce D under load makes an append costly
    to every turn landing there."""
    decodes = len(view.usable(Role.DECODE)) or 1
    step_s = (base.decode_step_ms + base.delay_ms) / 1000.0
    arriving = workload.qps / decodes * step_s
    return replace(base, queue_delay_ms=base.queue_delay_ms + arriving * base.delay_ms / 2)


def prefill_arrivals_delayed(workload: Workload, view: ClusterView, prediction: Prediction,
                             prefill: NodeState, costs: StepCosts) -> Prediction:
    """`prediction` with what P->D's prefill costs the turns that reach P after it
    (`Prediction.pd_queue_delay_ms`): P serves its queue first come, first served, so a turn
    arriving while the work ahead of this one runs waits this prefill out in full, and one
    arriving during it half of it on average. The proxy's turns arrive at `workload.qps`,
    spread over the usable Ps (each taken to reach a P: the most P may see)."""
    prefills = len(view.usable(Role.PREFILL)) or 1
    prompt = prompt_tokens(workload)
    held = min(prefill.held_tokens or 0, prompt)
    step_ms = costs.step_ms(prompt - held, held, 0, 0)
    ahead_ms = (prefill.running + prefill.waiting) * step_ms
    rate_per_ms = workload.qps / prefills / 1000.0
    delayed = rate_per_ms * (ahead_ms * step_ms + step_ms * step_ms / 2)
    return replace(prediction, pd_queue_delay_ms=delayed)


def prefill_wait_ms(prefill: NodeState, costs: StepCosts, scorer: LiveScorer,
                    prompt: int) -> float:
    """How long a turn waits in P's queue before its prefill starts: each waiting request's
    prefill and half of each running one's (on average half done), each request the size of
    the mean prompt live has seen (`LiveScorer.prompt`; this turn's before it has seen one)."""
    typical = round(scorer.prompt or prompt)
    return (prefill.running / 2 + prefill.waiting) * costs.step_ms(typical, 0, 0, 0)


def saves_time(prediction: Prediction, skipped_ms: float) -> bool:
    """Whether serving a turn on D (local) saves more time than it costs, time against time
    (the sum of the requests' completion times; no weights): what it skips (`skipped_ms`),
    plus the wait P->D's prefill would add to the turns behind it on P, must exceed its TTFT
    on D plus the stall its prefill adds to every request there (each running request's
    step, each queued one's admission, each arriving turn's wait). A turn 2+ skips P->D's
    whole TTFT (the history is on D). A turn 1 costs the same prefill on either node, so it
    skips only P's queue (`prefill_wait_ms`): it leaves the disaggregated path only when that
    wait outlasts D's whole answer and the others' stall."""
    skipped = skipped_ms + prediction.pd_queue_delay_ms
    cost = prediction.ttft_local_ms + prediction.batch_delay_ms + prediction.queue_delay_ms
    return skipped > cost


def placement_local(workload: Workload, view: ClusterView, prefill: NodeState,
                    decode: NodeView, costs: StepCosts,
                    scorer: LiveScorer) -> tuple[Prediction, NodeView] | None:
    """A homeless turn served whole on a D (plain serving: D prefills the prompt beside its
    batch) against P->D on (`prefill`, `decode`): the prediction on the D where it scores
    best (`LiveScorer.score`, turn 1's means) among those where it `saves_time`; None when
    no D with room for the prompt does."""
    prompt = prompt_tokens(workload)
    pd_state = node_state(decode)
    pd_held = min(pd_state.held_tokens or 0, prompt)
    ttft_pd = _pd_ttft_ms(workload, TurnState(pd_state, prefill), prompt, costs, d_held=pd_held)
    waited = prefill_wait_ms(prefill, costs, scorer, prompt)
    best: tuple[float, Prediction, NodeView] | None = None
    for node in view.usable(Role.DECODE):
        state = node_state(node)
        if not _has_room(state, prompt):
            continue
        cached = min(state.held_tokens or 0, prompt)
        local = _beside_batch(state, prompt - cached, cached, prompt, costs)
        prediction = Prediction(
            local.ttft_ms, ttft_pd, local.decode_step_ms, state.running * local.delay_ms,
            prompt - cached, local.delay_ms, state.tpot_sensitivity,
            joins_local=_joining(state, prompt, workload.n_out, costs),
            joins_pd=_joining(pd_state, prompt, workload.n_out, costs),
            queue_delay_ms=state.waiting * local.delay_ms)
        prediction = prefill_arrivals_delayed(
            workload, view, arrivals_delayed(workload, view, prediction), prefill, costs)
        if not saves_time(prediction, waited):
            continue
        score = scorer.score(prediction, first_turn=True)
        if best is None or score > best[0]:
            best = (score, prediction, node)
    return (best[1], best[2]) if best is not None else None
