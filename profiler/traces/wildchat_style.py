"""WildChat-style conversation shapes: turn counts and token lengths drawn from WildChat's
published statistics, for a grid when the dataset itself is not at hand.

The numbers, and where they come from (docs/live-routing.md, "WildChat-style traffic", says
which of them could be checked here):
- conversations and turns: WildChat-1M has 1,039,785 conversations with 2,639,415 turns (Zhao
  et al., "WildChat: 1M ChatGPT Interaction Logs in the Wild", ICLR 2024, arXiv 2405.01470,
  Table 1), so 2.54 turns per conversation;
- token lengths per turn, Llama-2 tokenizer (the same Table 1): user prompts 295.58 +- 1,609.18,
  assistant responses 441.34 +- 410.91 (mean +- standard deviation) - not checked against a
  copy of the table here (the copies reachable were cut off before its WildChat row);
- the long tail of conversations: 3.7% of them have more than 10 turns - a secondary summary's
  figure (emergentmind.com's WildChat topic page), not found in the paper's text reachable here.

Families, and why:
- Token lengths are lognormal, matched to the published mean and standard deviation. Both are
  positive and right-skewed, and a user prompt's standard deviation of 5.4 times its mean says
  the mean is carried by rare long pastes: the lognormal with these moments has its median at
  53 tokens, 5.5% of prompts over 1,024 tokens and 0.3% over 8,192 - mixed lengths with a share
  of long pastes, without a separate paste model whose share no source gives.
- Turns per conversation are 1 + a negative binomial (a geometric whose stopping chance varies
  between users, drawn from a gamma): a plain geometric with mean 2.54 puts only 0.7% of
  conversations above 10 turns, a fifth of the 3.7% reported; the negative binomial's second
  parameter is set to that share (r = 0.236: 62% of conversations are single-turn).
- User and assistant lengths are independent, across turns too: no source gives a correlation.

A conversation ends before a turn whose context (history, new prompt and reply) would exceed
MAX_CONTEXT_TOKENS, as `TraceFilter.max_context_tokens` cuts trace conversations; at these
parameters that touches 4 conversations in 100,000.

Seeded and deterministic: each conversation draws from its own string-seeded generator, so the
first k of n shapes are the k shapes asked for alone, and shapes never depend on the text.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from proxy.shared.discretize import Shape

# WildChat-1M (Zhao et al., ICLR 2024, Table 1): conversations and turns.
WILDCHAT_CONVERSATIONS = 1_039_785
WILDCHAT_TURNS = 2_639_415
MEAN_TURNS = WILDCHAT_TURNS / WILDCHAT_CONVERSATIONS  # 2.538
# Secondary summary (emergentmind.com, "WildChat dataset" topic): conversations over 10 turns.
SHARE_OVER_10_TURNS = 0.037
# Table 1, Llama-2 tokenizer: tokens per user prompt and per assistant response (unchecked here).
USER_TOKENS_MEAN, USER_TOKENS_SD = 295.58, 1_609.18
ASSISTANT_TOKENS_MEAN, ASSISTANT_TOKENS_SD = 441.34, 410.91
# Llama 3.1's context window (the simulator's model, and EngineConfig.max_model_len).
MAX_CONTEXT_TOKENS = 131_072


@dataclass(frozen=True, slots=True)
class LogNormal:
    """exp(N(mu, sigma^2)), the parameters of the normal it exponentiates."""

    mu: float
    sigma: float

    @classmethod
    def matching(cls, mean: float, sd: float) -> LogNormal:
        """The lognormal with this mean and standard deviation."""
        sigma2 = math.log1p((sd / mean) ** 2)
        return cls(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma ** 2 / 2)

    @property
    def sd(self) -> float:
        return self.mean * math.sqrt(math.expm1(self.sigma ** 2))

    def draw(self, rng: random.Random) -> int:
        """A whole number of tokens, at least 1."""
        return max(1, round(rng.lognormvariate(self.mu, self.sigma)))


@dataclass(frozen=True, slots=True)
class TurnCount:
    """1 + NegativeBinomial(r, mean - 1): a gamma-mixed geometric number of turns."""

    r: float
    mean: float

    @classmethod
    def matching(cls, mean: float, share_over_10: float) -> TurnCount:
        """The r that gives P(turns > 10) = share_over_10 at this mean. The share peaks near
        r = 0.1 (4.8% at a mean of 2.54; below it the mass piles onto one turn) and falls to
        the geometric's at r = 1; the bisection runs on that falling side, the one nearer a
        geometric."""
        low, high = 0.1, 1.0
        if not cls(low, mean).share_over(10) > share_over_10 > cls(high, mean).share_over(10):
            raise ValueError(f"no r in [{low}, {high}] gives P(turns > 10) = {share_over_10}")
        for _ in range(60):
            middle = (low + high) / 2
            if cls(middle, mean).share_over(10) > share_over_10:
                low = middle
            else:
                high = middle
        return cls((low + high) / 2, mean)

    def pmf(self, turns: int) -> float:
        """P(exactly `turns` turns)."""
        k, r = turns - 1, self.r
        if k < 0:
            return 0.0
        p = r / (r + self.mean - 1)
        return math.exp(math.lgamma(k + r) - math.lgamma(r) - math.lgamma(k + 1)
                        + r * math.log(p) + k * math.log1p(-p))

    def share_over(self, turns: int) -> float:
        """P(more than `turns` turns)."""
        return 1.0 - sum(self.pmf(n) for n in range(1, turns + 1))

    def draw(self, rng: random.Random) -> int:
        rate = rng.gammavariate(self.r, (self.mean - 1) / self.r)
        return 1 + _poisson(rng, rate)


def _poisson(rng: random.Random, rate: float) -> int:
    # Inversion by sequential search: exact, and the rates here are a few turns on average.
    if rate > 500:  # exp(-rate) underflows; a gamma draw this far out is ~1e-9 likely
        return round(rng.gauss(rate, math.sqrt(rate)))
    count, term = 0, math.exp(-rate)
    cumulative, u = term, rng.random()
    while u > cumulative:
        count += 1
        term *= rate / count
        cumulative += term
    return count


USER_TOKENS = LogNormal.matching(USER_TOKENS_MEAN, USER_TOKENS_SD)
ASSISTANT_TOKENS = LogNormal.matching(ASSISTANT_TOKENS_MEAN, ASSISTANT_TOKENS_SD)
TURNS = TurnCount.matching(MEAN_TURNS, SHARE_OVER_10_TURNS)


def conversation_shape(seed: int, index: int) -> tuple[Shape, ...]:
    """Conversation `index` of seed: each turn's (user tokens, assistant tokens)."""
    rng = random.Random(f"ppd-wildchat-style:{seed}:{index}")
    turns: list[Shape] = []
    context = 0
    for _ in range(TURNS.draw(rng)):
        n_in, n_out = USER_TOKENS.draw(rng), ASSISTANT_TOKENS.draw(rng)
        if context + n_in + n_out > MAX_CONTEXT_TOKENS:
            if turns:
                break
            n_in = max(1, MAX_CONTEXT_TOKENS - n_out)
        turns.append(Shape(n_in, n_out))
        context += n_in + n_out
    return tuple(turns)


def conversation_shapes(count: int, seed: int) -> list[tuple[Shape, ...]]:
    """The first `count` WildChat-style conversation shapes of seed."""
    return [conversation_shape(seed, index) for index in range(count)]
