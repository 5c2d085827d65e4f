"""The decision table's score for one turn, as the turn moves it: `LiveScorer`.

`proxy.live.predict` predicts what each route costs the turn and the batch it joins; this scores
that prediction the way the decision table scores a cell (mean turn-2+ TTFT and mean TPOT, each
relative to P->D's), so a turn is sent local iff its score is > 0 (docs/live-routing.md).
Pure: no clock, no I/O.
"""

from __future__ import annotations

from typing import NamedTuple

from proxy.live.predict import Membership, Prediction
from proxy.shared.vocabulary import Workload

_MIN_TURN1_SHARE = 0.05


class LiveScorer(NamedTuple):
    """The decision table's score for one turn, against the cluster's typical turn.

    The table scores a cell by mean turn-2+ TTFT relative to P->D's and mean TPOT relative
    to P->D's. One turn moves those means by its own TTFT difference over the mean P->D TTFT,
    and by the delay it adds to each of D's B running requests, spread over that request's
    output, over the mean TPOT - weighted by the share of requests that are turn 2+. The
    batch's sum of 1/(n_out - 1) is used when known (`NodeState.tpot_sensitivity`); else, as
    a request sits in a batch for a time proportional to its output, B / (mean n_out). The
    means are exponentially weighted over the turns decided so far (the policy's own inputs
    and predictions: no clock, no I/O), starting from this turn's own values. The scorer is
    immutable (a NamedTuple: cheap to copy on every decision): `counted` and `scored` hand
    back the moved means, which the policy's caller keeps (`proxy.policies.routing.RoutingPolicy`).

    A turn-1 placement (a hybrid pool: a replica or P->D) is scored the same way against the
    mean turn-1 TTFT, kept apart (a whole prompt's P->D TTFT is not a follow-up's), with the
    prefill's delay to the replica's batch weighted by the share of requests that are turn 1.

    A placement also picks the batch the conversation decodes in for the rest of its life,
    R's or D's: each route adds its `membership_ms` m_N per request, and the score charges
    (m_R - m_D) / mean step times a weight, derived per request as the rest of the score is.
    The table's mean TPOT is over all N requests; the conversation sends K of them, each
    adding m_N to the summed TPOT, so the mean moves by K m_N / N. A turn-1 placement is
    scored per turn-1 decision, as its TTFT gain is (the N_1 placements move the turn-1
    mean), which multiplies that by N_1: the weight is K N_1 / N = share_1 x K. Every
    conversation has exactly one turn 1, so K = N / N_1 on average and the weight is 1 - with
    this scorer's counters, (1 - followup_share) x 1 / (1 - followup_share), whatever they
    read. A re-placement of a turn 2+ (its node gone) is scored per turn-2+ decision (share_2+
    = followup_share) and charges the turns the conversation has left; taking the number of
    turns as memoryless (geometric), a conversation at any turn has as many left, this one
    included, as a new one has: 1 / share_1. Its weight is share_2+ / share_1. The later turns
    are not known yet: each is charged as this one (its n_out and context), and their
    append-prefills beside the batch are charged to neither route (on D they are decided,
    and charged, turn by turn).
    """

    w_ttft: float
    w_tpot: float
    halflife_turns: float = 200.0
    ttft_pd_ms: float | None = None
    ttft_pd_first_ms: float | None = None  # turn-1 placements' reference
    step_ms: float | None = None
    n_out: float | None = None
    followup_share: float = 0.5
    prompt: float | None = None  # mean prompt tokens (n_ctx + n_in) of the turns decided

    @property
    def _alpha(self) -> float:
        return 1.0 - 0.5 ** (1.0 / self.halflife_turns)

    def counted(self, workload: Workload) -> LiveScorer:
        """The means with one more decided turn (turn 1 too): the share of requests that are
        turn 2+, the mean output length and the mean prompt (the size live takes a request
        queued on P to be when it weighs serving a turn 1 on a D)."""
        alpha = self._alpha
        share = self.followup_share + alpha * (float(workload.turn > 1) - self.followup_share)
        n_out = _moved(self.n_out, float(max(workload.n_out, 1)), alpha)
        prompt = _moved(self.prompt, float(workload.n_ctx + workload.n_in), alpha)
        # The constructor, not _replace: this runs on every decision.
        return LiveScorer(self.w_ttft, self.w_tpot, self.halflife_turns, self.ttft_pd_ms,
                          self.ttft_pd_first_ms, self.step_ms, n_out, share, prompt)

    def scored(self, prediction: Prediction,
               first_turn: bool = False) -> tuple[float, LiveScorer]:
        """The score (> 0: local - or, placing turn 1, the replica - is better by the table's
        weights) and the means with this prediction counted."""
        alpha = self._alpha
        ttft_ref = _moved(self.ttft_pd_first_ms if first_turn else self.ttft_pd_ms,
                          prediction.ttft_pd_ms, alpha)
        step_ref = _moved(self.step_ms, prediction.decode_step_ms, alpha)
        # The requests queued on D wait out local's longer step too: their TTFTs count in
        # the mean as this turn's does.
        gain = (prediction.ttft_pd_ms + prediction.pd_queue_delay_ms
                - prediction.ttft_local_ms - prediction.queue_delay_ms) / ttft_ref
        if prediction.tpot_sensitivity is not None:  # the batch's own output lengths
            delayed = prediction.delay_ms * prediction.tpot_sensitivity
        else:
            delayed = prediction.batch_delay_ms / (self.n_out or 1.0)
        share = 1.0 - self.followup_share if first_turn else self.followup_share
        summed = share * delayed
        if prediction.joins_local is not None and prediction.joins_pd is not None:
            summed += self.membership_weight(first_turn) * (
                self.membership_ms(prediction.joins_local)
                - self.membership_ms(prediction.joins_pd))
        tpot_loss = summed / step_ref if step_ref > 0 else 0.0
        score = self.w_ttft * gain - self.w_tpot * tpot_loss
        moved = LiveScorer(self.w_ttft, self.w_tpot, self.halflife_turns,
                           self.ttft_pd_ms if first_turn else ttft_ref,
                           ttft_ref if first_turn else self.ttft_pd_first_ms, step_ref,
                           self.n_out, self.followup_share, self.prompt)
        return score, moved

    def score(self, prediction: Prediction, first_turn: bool = False) -> float:
        """`scored`'s score alone."""
        return self.scored(prediction, first_turn)[0]

    def readback_score(self, prediction: Prediction) -> float | None:
        """Readback's score against P->D, on the means `scored` returned (call it first):
        its TTFT gain alone, since D's batch is untouched as on P->D. None: no readback."""
        if prediction.ttft_readback_ms is None:
            return None
        ttft_ref = self.ttft_pd_ms or prediction.ttft_pd_ms
        gain = (prediction.ttft_pd_ms - prediction.ttft_readback_ms) / ttft_ref
        return self.w_ttft * gain

    def membership_ms(self, join: Membership) -> float:
        """One request of the conversation decoding in a node's batch, in summed TPOT: its
        own TPOT, plus c on each step it shares with another request j of the batch, which
        raises j's TPOT by c x min(1, n_out / n_out_j). Summed over the batch from its output
        lengths when known (min(B, n_out x sum of 1 / (n_out_j - 1))), else B x min(1, n_out
        / mean n_out)."""
        if join.tpot_sensitivity is not None:
            overlapped = min(join.others, join.n_out * join.tpot_sensitivity)
        else:
            overlapped = join.others * min(1.0, join.n_out / (self.n_out or 1.0))
        return join.own_step_ms + join.per_step_ms * overlapped

    def membership_weight(self, first_turn: bool) -> float:
        """How many of the placed conversation's requests one placement stands for, per
        decision of its kind (see the class docstring): 1 for turn 1, share_2+ / share_1 for
        a re-placement."""
        if first_turn:
            return 1.0
        # A share of turn 1 near 0 is a run of re-placements, not conversations of hundreds
        # of turns: bound the turns left at 20.
        return self.followup_share / max(1.0 - self.followup_share, _MIN_TURN1_SHARE)



def _moved(mean: float | None, value: float, alpha: float) -> float:
    """An exponentially weighted mean moved by one value (the value itself to start)."""
    return value if mean is None else mean + alpha * (value - mean)
