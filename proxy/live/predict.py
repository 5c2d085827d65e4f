"""`--policy live`: each turn 2+ routed from what D still holds and how busy the nodes are now.

Pure: `predict` and `proxy.live.scorer.LiveScorer`
read no clock and do no I/O; the policy is `proxy.policies.live`.
For the turn it predicts, with a linear step-cost model (`StepCosts`):

- local (append-prefill on the session's D): D must prefill the tokens it no longer holds
  (n_ctx - held, from `proxy.live.residency`) plus the new n_in, in one step beside its running
  decode batch of B requests: TTFT = the front end + the rest of D's current step + D's
  queue + that step;
- P->D: P prefills the whole history it does not hold plus n_in; D admits the request in
  one step, pulls the KV its own prefix cache lacks, and decodes its first token in a later
  step: TTFT = two front ends (P's and D's API servers) + P's queue + P's prefill + about
  three of D's steps + the transfer;
- readback (docs/readback.md), when the session's D keeps the history's blocks for it: P
  reads the history it does not hold from D over the link, prefills only the rest, and the
  turn goes on as P->D: TTFT = P->D's with P's prefill cut to the new tokens, plus P's
  /tokenize of the new prompt (a front end) and that transfer; D's batch is untouched, as
  on P->D, so its TPOT is P->D's. Only while D has room for the whole prompt
  (`NodeState.free_kv_tokens`): P's read frees D's kept copy, and a D short of room hands
  those blocks to its waiting requests before the turn's D leg comes back, which then
  waits for room to receive the whole history again;
- the TPOT the local route costs D's batch: the prefill lengthens one of D's steps by
  delta = step(B decodes + prefill) - step(B decodes), a delay each of the B running
  requests spreads over its n_out tokens.

Then the decision table's own score, as one turn moves it (`LiveScorer`): local iff > 0,
unless readback scores higher still (`LiveScorer.readback_score`: its TTFT gain over P->D,
no TPOT change).
A turn that goes P->D because D no longer holds its whole history has reason `evicted`.

In a hybrid pool (R nodes beside P and D) a conversation without a home - turn 1, or its
node is gone - is placed (`predict_placement`): a replica prefills the whole prompt (less
what it caches) in one step beside its own running batch, exactly as local does on D but for
the whole prompt, so its TTFT and the delay it adds to the replica's batch are local's
formulas on the replica; P->D is as above. The same score decides; a conversation placed on
a replica stays there (its prefix cache holds the history). So a placement also chooses the
batch the conversation decodes in, for all its turns: R's or D's. Each route is charged for
the batch it joins (`Membership`, `LiveScorer.membership_ms`): with B requests decoding on the
node, a request of the conversation has its own TPOT of about step(B + 1 decodes), and it
lengthens each step of that batch by c = per_decode_seq + per_decode_kv_ktoken x its context,
raising the others' TPOT by c times the share of their tokens it decodes beside. A turn 2+
that stays with its D (local or P->D) does not change the batch it decodes in; `predict`
charges no membership.

The costs are a cost file (`--live-costs`: a `ppd sim fit` preset, or `ppd sim live-costs`
fitted to a GPU preset): a model of the node's step, not of a cell, so it predicts states a
table never measured (a half-evicted D, a batch twice the profiled one) and needs no served
turns to start from. A decision table, when given, is the prior for the state it measured:
when D holds the whole history the table's verdict for the cell stands (`proxy.policies.live`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

from proxy.shared.vocabulary import Workload


@dataclass(frozen=True, slots=True)
class StepCosts:
    """A linear model of one engine step, in ms (the form of `profiler.engine.cost.LinearCost`):

    step = base + per_prefill_token * P + per_prefill_attention * P * (ctx + P/2) / 1000
           + per_decode_seq * B + per_decode_kv_ktoken * KV / 1000
    plus a transfer: transfer_base_ms + transfer_ms_per_ktoken * tokens / 1000, and a pass
    through an API server (`frontend_ms`)."""

    base_ms: float
    per_prefill_token_ms: float
    per_decode_seq_ms: float
    per_decode_kv_ktoken_ms: float = 0.0
    per_prefill_attention_ms: float = 0.0
    transfer_base_ms: float = 0.0
    transfer_ms_per_ktoken: float = 0.0
    # One pass through an API server before its engine sees the request (HTTP, chat
    # template, tokenization): frontend_base_ms + frontend_ms_per_ktoken x prompt tokens /
    # 1000. Local passes one (D's), P->D two (P's, then D's), a readback three (P's
    # /tokenize of the new prompt first).
    frontend_base_ms: float = 0.0
    frontend_ms_per_ktoken: float = 0.0
    source: str = ""

    def step_ms(self, prefill: int, prefill_ctx: int, decodes: float, decode_kv: float) -> float:
        cost = self.base_ms + self.per_decode_seq_ms * decodes \
            + self.per_decode_kv_ktoken_ms * decode_kv / 1000.0
        if prefill > 0:
            cost += prefill * (self.per_prefill_token_ms + self.per_prefill_attention_ms
                               * (prefill_ctx + prefill / 2) / 1000.0)
        return cost

    def transfer_ms(self, tokens: int) -> float:
        return self.transfer_base_ms + self.transfer_ms_per_ktoken * tokens / 1000.0

    def frontend_ms(self, prompt_tokens: int) -> float:
        return self.frontend_base_ms + self.frontend_ms_per_ktoken * prompt_tokens / 1000.0

    @classmethod
    def load(cls, path: Path) -> StepCosts:
        """A cost file: JSON with these fields (extra keys such as `name` are ignored)."""
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise ValueError(f"cannot read live cost file {path}: {exc.strerror or exc}") \
                from exc
        except json.JSONDecodeError as exc:
            raise ValueError(f"live cost file {path} is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"live cost file {path} must hold a JSON object")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in ("base_ms", "per_prefill_token_ms", "per_decode_seq_ms"):
            if name not in values:
                raise ValueError(f"live cost file {path} lacks {name!r}")
        for name, value in values.items():
            if name != "source" and (not isinstance(value, (int, float))
                                     or not math.isfinite(value) or value < 0):
                raise ValueError(f"live cost file {path}: {name} must be a number >= 0")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class NodeState:
    """What is known of one node now (None: not known)."""

    running: float = 0.0  # requests in its batch (/metrics, else the proxy's in-flight)
    waiting: float = 0.0  # requests queued
    held_tokens: int | None = None  # leading tokens of this session it holds (residency)
    block_size: int = 1  # only full blocks are cached: a shorter tail is never "held"
    # Sum over the running batch of 1 / (n_out - 1): how much one step's delay raises the
    # batch's summed TPOT. None: not known (the policy uses running / mean n_out).
    tpot_sensitivity: float | None = None
    # Tokens of KV it has room for now: (1 - vLLM's kv_cache_usage_perc) x its blocks x the
    # block size, pinned blocks counted as used. None: not known.
    free_kv_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class TurnState:
    """The session's D (else the D a P->D turn would use), the P a P->D turn would use and,
    in a hybrid pool, the replica a conversation placed on a replica would use (None: no
    usable replica, so there is nothing to place on)."""

    decode: NodeState
    prefill: NodeState
    replica: NodeState | None = None
    # The session's D keeps the history's blocks for a readback now (the proxy's book says
    # so; `proxy.routing.turn_plan.plan_turn` sets it).
    readback: bool = False


@dataclass(frozen=True, slots=True)
class Membership:
    """A request of the conversation decoding in a node's batch (a placement's route): what
    it pays and what it costs the others, per step (see `LiveScorer.membership_ms`)."""

    own_step_ms: float  # the node's decode step with the request in the batch: its own TPOT
    per_step_ms: float  # c: how much longer the request makes each step of that batch
    others: float  # the batch it joins (B)
    n_out: int  # the request's expected output: how long it stays in the batch
    tpot_sensitivity: float | None  # the batch's sum of 1 / (n_out_j - 1), when known


@dataclass(frozen=True, slots=True)
class Prediction:
    """Both routes' predicted TTFT (ms) and what the local route does to D's batch; for a
    placement, also the batch each route has the conversation decode in."""

    ttft_local_ms: float
    ttft_pd_ms: float
    decode_step_ms: float  # D's step with its batch alone
    batch_delay_ms: float  # sum over D's running requests of the delay local adds to them
    missing_tokens: int  # history tokens D no longer holds
    delay_ms: float = 0.0  # how much longer local makes D's step
    tpot_sensitivity: float | None = None  # NodeState.tpot_sensitivity of D
    joins_local: Membership | None = None  # placement: the replica's batch
    joins_pd: Membership | None = None  # placement: D's batch
    ttft_readback_ms: float | None = None  # None: no blocks to read back
    # Sum over the requests queued on D (admitted next, first token still to come) of the
    # delay local's longer step adds to their TTFT.
    queue_delay_ms: float = 0.0
    # Sum over the turns that reach P after this one (queued behind it: P serves first come,
    # first served) of the delay P->D's prefill adds to their TTFT - what local spares them
    # (`proxy.live.nodes.prefill_arrivals_delayed`; a turn 1's prediction only).
    pd_queue_delay_ms: float = 0.0


def predict(workload: Workload, state: TurnState, costs: StepCosts) -> Prediction:
    """Both routes of one turn 2+ (see the module docstring)."""
    n_ctx, n_in = workload.n_ctx, workload.n_in
    held = state.decode.held_tokens
    held = n_ctx if held is None else min(held, n_ctx)
    missing = n_ctx - held
    if missing <= state.decode.block_size:
        # Only full blocks are cached, and the last sampled token has no KV yet: the partial
        # last block is recomputed on either route.
        missing = 0
    local = _beside_batch(state.decode, missing + n_in, held, n_ctx, costs)
    # P can read back only what D still holds: vLLM pins a finished turn's kept blocks (no
    # eviction event), so on a real D that is the whole history; where D's residency says
    # blocks are gone (the simulator does not pin them), P computes them as on P->D.
    d_held = n_ctx - missing
    readback = (_pd_ttft_ms(workload, state, n_ctx, costs, read_back=d_held, d_held=d_held)
                if state.readback and _has_room(state.decode, n_ctx + n_in) else None)
    return Prediction(local.ttft_ms, _pd_ttft_ms(workload, state, n_ctx, costs, d_held=d_held),
                      local.decode_step_ms,
                      state.decode.running * local.delay_ms, missing, local.delay_ms,
                      state.decode.tpot_sensitivity, ttft_readback_ms=readback,
                      queue_delay_ms=state.decode.waiting * local.delay_ms)


def _has_room(node: NodeState, tokens: int) -> bool:
    """Whether the node can take `tokens` of new KV now without waiting (unknown: yes).

    What a readback needs of D: vLLM frees D's kept blocks when P's read completes, so the
    turn's D leg finds the history in D's prefix cache only if nothing claimed the room in
    between; with room for the whole prompt it is admitted either way. Without it, D's
    waiting requests take the freed blocks and the leg waits for room to receive the whole
    history again (a D whose cache is full of kept blocks: docs/readback.md)."""
    return node.free_kv_tokens is None or node.free_kv_tokens >= tokens


def predict_placement(workload: Workload, state: TurnState, costs: StepCosts) -> Prediction:
    """A conversation without a home in a hybrid pool: on a replica (the Prediction's local
    side: the whole prompt but what the replica caches, prefilled beside its running batch)
    or P->D (as `predict`). `decode_step_ms` stays D's: P->D's TPOT is the reference. Each
    route also carries the batch the conversation then decodes in (`joins_local`: the
    replica's, `joins_pd`: D's)."""
    assert state.replica is not None, "placement needs a replica to place on"
    replica = state.replica
    prompt = workload.n_ctx + workload.n_in
    cached = min(replica.held_tokens or 0, prompt)
    on_replica = _beside_batch(replica, prompt - cached, cached, prompt, costs)
    decode_step = _decode_step_ms(state.decode, prompt, costs)
    return Prediction(on_replica.ttft_ms, _pd_ttft_ms(workload, state, prompt, costs),
                      decode_step, replica.running * on_replica.delay_ms,
                      max(workload.n_ctx - cached, 0),
                      on_replica.delay_ms, replica.tpot_sensitivity,
                      _joining(replica, prompt, workload.n_out, costs),
                      _joining(state.decode, prompt, workload.n_out, costs))


def _joining(node: NodeState, prompt: int, n_out: int, costs: StepCosts) -> Membership:
    """The request decoding in the node's batch, its KV the prompt plus half its output
    (the mean while it decodes); the batch's context taken as the request's own, as
    `_decode_step_ms` does."""
    context = prompt + n_out / 2
    per_step = costs.per_decode_seq_ms + costs.per_decode_kv_ktoken_ms * context / 1000.0
    batch = node.running + 1
    return Membership(costs.step_ms(0, 0, batch, batch * context), per_step, node.running,
                      n_out, node.tpot_sensitivity)


@dataclass(frozen=True, slots=True)
class _BesideBatch:
    ttft_ms: float  # the rest of the node's step + its queue + the step with the prefill
    decode_step_ms: float  # the node's step with its batch alone
    delay_ms: float  # how much longer the prefill makes that step


def _decode_step_ms(node: NodeState, context: int, costs: StepCosts) -> float:
    # The turn's context as the batch's typical one.
    return costs.step_ms(0, 0, node.running, node.running * context)


def _beside_batch(node: NodeState, prefill: int, cached: int, context: int,
                  costs: StepCosts) -> _BesideBatch:
    """`prefill` tokens after `cached` ones, in one step beside the node's running batch."""
    decode_step = _decode_step_ms(node, context, costs)
    step = costs.step_ms(prefill, cached, node.running, node.running * context)
    ttft = (costs.frontend_ms(cached + prefill) + decode_step / 2
            + node.waiting * decode_step + step)
    return _BesideBatch(ttft, decode_step, step - decode_step)


def _pd_ttft_ms(workload: Workload, state: TurnState, context: int,
                costs: StepCosts, read_back: int | None = None, d_held: int = 0) -> float:
    """P->D's TTFT; with `read_back` tokens of history, a readback's: P first reads those it
    does not hold from D (the link), then computes only what follows them. D pulls only what
    its own prefix cache lacks: the prompt less its first `d_held` tokens (vLLM's NIXL D
    matches its local cache first and asks P for the rest)."""
    n_ctx, n_in = workload.n_ctx, workload.n_in
    batch = state.decode.running
    decode_kv = batch * context
    decode_step = _decode_step_ms(state.decode, context, costs)
    p_held = min(state.prefill.held_tokens or 0, n_ctx)
    p_has = max(p_held, min(read_back or 0, n_ctx))
    frontend = costs.frontend_ms(n_ctx + n_in)
    read = 0.0
    if read_back is not None:
        # P's /tokenize of the new prompt (which tells the proxy how much of D's blocks
        # match), then the read of what P does not hold.
        read = frontend + (costs.transfer_ms(p_has - p_held) if p_has > p_held else 0.0)
    p_prefill = costs.step_ms(n_ctx + n_in - p_has, p_has, 0, 0)
    p_queue = (state.prefill.running + state.prefill.waiting) * p_prefill
    # D's side of P->D (vLLM's P/D connectors): the request waits for D's step in flight,
    # is admitted (blocks allocated) in the next step, pulls the KV after it, waits for the
    # step then in flight, and gets its first token from the step after that.
    return (2 * frontend + read + p_queue + p_prefill + decode_step / 2 + decode_step
            + costs.transfer_ms(n_ctx + n_in - d_held) + decode_step / 2
            + costs.step_ms(0, 0, batch + 1, decode_kv + n_ctx + n_in))
