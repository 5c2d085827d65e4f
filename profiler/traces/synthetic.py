"""Synthetic multi-turn workloads: the PPD paper's turn-1 profiles times its nine turn-2 shapes.

Prompts are random English words, seeded per conversation, so every conversation's text is
different from its first token on (prefix caches never cross-hit between conversations) and the
same seed always gives the same workload. With a tokenizer, each user message has exactly the
requested number of tokens of that tokenizer: the turn's n_in under the token definition the
proxy counts with (proxy.shared.tokens, text-v1), so the cell a turn is made for is the cell the
proxy
files it under.

Named workloads for `ppd replay --dataset synthetic:NAME`:
- `small-mid_bal`, `large-huge_paste`, `huge-tiny`, ...: a turn-1 profile (small 128/128,
  large 1024/1024, huge 8192/1024; proxy.shared.discretize.TURN1_PROFILES) and one of the nine
  turn-2
  shapes (proxy.shared.discretize.WORKLOAD_SHAPES);
- `mixed`: the paper's two profiles (small, large) and all nine shapes, drawn per conversation;
- `multi-N` (e.g. `multi-4`): N turns, turn 1 from small or large, each later turn a random
  shape;
- `wildchat`: WildChat-style traffic - turns per conversation and each turn's user and
  assistant tokens drawn from WildChat's published statistics (profiler.traces.wildchat_style).
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Sequence

from profiler.traces.conversation import Conversation, Turn
from profiler.traces.wildchat_style import conversation_shapes
from proxy.shared.discretize import (
    PAPER_CONTEXTS,
    TURN1_PROFILES,
    WORKLOAD_SHAPES,
    ContextClass,
    Shape,
)
from proxy.shared.tokens import EstimateTokenCounter, TokenCounter

# Common short words: natural enough that real tokenizers give about one token per word.
_WORD_TEXT = (
    "the of and to in is you that it he was for on are as with his they at be this have from "
    "or one had by word but not what all were we when your can said there use an each which she "
    "do how their if will up other about out many then them these so some her would make like "
    "him into time has look two more write go see number no way could people my than first "
    "water been call who oil its now find long down day did get come made may part over new "
    "sound take only little work know place year live me back give most very after thing our "
    "just name good sentence man think say great where help through much before line right too "
    "mean old any same tell boy follow came want show also around form three small set put end "
    "does another well large must big even such because turn here why ask went men read need "
    "land different home us move try kind hand picture again change off play spell air away "
    "animal house point page letter mother answer found study still learn should world high"
)
_WORDS = tuple(_WORD_TEXT.split())

# A few tries with a corrected length are enough for BPE round-trips to settle.
_MAX_ADJUSTMENTS = 12


def exact_text(rng: random.Random, n_tokens: int, tokenizer: TokenCounter) -> str:
    """Random words cut to exactly n_tokens tokens of tokenizer (closest reachable if not)."""
    if n_tokens <= 0:
        return ""
    words: list[str] = []
    text = ""
    while tokenizer.count(text) < n_tokens + 4:
        words.extend(rng.choice(_WORDS) for _ in range(n_tokens + 8))
        text = " ".join(words)
    # Decoding a token prefix and re-encoding it can merge differently at the cut; steer the
    # cut length until the round trip gives the exact count.
    target = n_tokens
    best, best_error = text, abs(tokenizer.count(text) - n_tokens)
    for _ in range(_MAX_ADJUSTMENTS):
        cut = tokenizer.truncate(text, target)
        # Prefer a cut without trailing blanks, but a blank may be the token that is needed.
        for candidate in dict.fromkeys((cut.rstrip(), cut)):
            if tokenizer.count(candidate) == n_tokens:
                return candidate
        candidate = cut.rstrip()
        got = tokenizer.count(candidate)
        if abs(got - n_tokens) < best_error:
            best, best_error = candidate, abs(got - n_tokens)
        target += n_tokens - got
    return best


def _conversation_rng(seed: int, tag: str, index: int) -> random.Random:
    # String seeds hash deterministically (unlike hash()), so workloads are stable across runs.
    return random.Random(f"ppd-synthetic:{seed}:{tag}:{index}")


def _rendered(shapes: Sequence[Shape], rng: random.Random,
              tokenizer: TokenCounter) -> tuple[Turn, ...]:
    # Each user message is random words of exactly its shape's tokens; the reply is a length.
    return tuple(Turn(user=exact_text(rng, shape.n_in, tokenizer), reference_answer=None,
                      n_out_tokens=shape.n_out) for shape in shapes)


def two_turn_conversations(
    turn1: Shape,
    turn2_shape: str,
    count: int,
    *,
    seed: int,
    tokenizer: TokenCounter | None = None,
) -> list[Conversation]:
    """`count` two-turn conversations: turn 1 of shape turn1, turn 2 of the named shape."""
    if turn2_shape not in WORKLOAD_SHAPES:
        raise ValueError(
            f"unknown turn-2 shape {turn2_shape!r}; expected one of {', '.join(WORKLOAD_SHAPES)}"
        )
    return multi_turn_conversations(
        turn1, [turn2_shape], n_turns=2, count=count, seed=seed, tokenizer=tokenizer
    )


def multi_turn_conversations(
    turn1: Shape,
    later_shapes: Sequence[str],
    *,
    n_turns: int,
    count: int,
    seed: int,
    tokenizer: TokenCounter | None = None,
) -> list[Conversation]:
    """`count` conversations of n_turns turns: turn 1 of shape turn1, each later turn of a shape
    drawn (seeded) from later_shapes."""
    if n_turns < 1 or count < 0:
        raise ValueError("n_turns must be >= 1 and count >= 0")
    unknown = [name for name in later_shapes if name not in WORKLOAD_SHAPES]
    if unknown or (n_turns > 1 and not later_shapes):
        raise ValueError(f"later_shapes must be names from {', '.join(WORKLOAD_SHAPES)}")
    tok = tokenizer or EstimateTokenCounter()
    shapes_tag = "any" if set(later_shapes) == set(WORKLOAD_SHAPES) else "+".join(later_shapes)
    tag = f"{turn1.n_in}x{turn1.n_out}-{shapes_tag}-{n_turns}"
    conversations = []
    for index in range(count):
        rng = _conversation_rng(seed, tag, index)
        shapes = [turn1] + [WORKLOAD_SHAPES[rng.choice(later_shapes)] for _ in range(n_turns - 1)]
        conversations.append(Conversation(id=f"syn-{tag}-s{seed}-{index}",
                                          turns=_rendered(shapes, rng, tok)))
    return conversations


def wildchat_conversations(count: int, *, seed: int,
                           tokenizer: TokenCounter | None = None) -> list[Conversation]:
    """`count` WildChat-style conversations: shapes from wildchat_style, text as above."""
    tok = tokenizer or EstimateTokenCounter()
    conversations = []
    for index, shapes in enumerate(conversation_shapes(count, seed)):
        rng = _conversation_rng(seed, "wildchat", index)
        conversations.append(Conversation(id=f"syn-wildchat-s{seed}-{index}",
                                          turns=_rendered(shapes, rng, tok)))
    return conversations


def _profile(name: str) -> Shape:
    try:
        return TURN1_PROFILES[ContextClass(name)]
    except ValueError:
        raise ValueError(
            f"unknown turn-1 profile {name!r}; expected one of "
            f"{', '.join(str(c) for c in TURN1_PROFILES)}"
        ) from None


def synthetic_names() -> list[str]:
    """Every name `named_workload` accepts (multi-N shown as multi-4)."""
    pairs = [f"{c}-{s}" for c in TURN1_PROFILES for s in WORKLOAD_SHAPES]
    return [*pairs, "mixed", "multi-4", "wildchat"]


def named_workload(
    name: str, count: int, *, seed: int, tokenizer: TokenCounter | None = None
) -> list[Conversation]:
    """The synthetic workload called name (see the module docstring), `count` conversations."""
    if name == "wildchat":
        return wildchat_conversations(count, seed=seed, tokenizer=tokenizer)
    shapes = list(WORKLOAD_SHAPES)
    profiles = list(PAPER_CONTEXTS)
    if name == "mixed" or name.startswith("multi-"):
        if name == "mixed":
            n_turns = 2
        else:
            try:
                n_turns = int(name.removeprefix("multi-"))
            except ValueError:
                raise ValueError(f"bad synthetic workload {name!r}: use multi-N, N >= 1") from None
        # The paper's two profiles (not huge: an 8k-token turn 1 is beyond a CPU cluster's
        # max_model_len) alternate deterministically so both are always present.
        out: list[Conversation] = []
        for position, context in enumerate(profiles):
            share = count // len(profiles) + (1 if position < count % len(profiles) else 0)
            out.extend(multi_turn_conversations(
                TURN1_PROFILES[context], shapes, n_turns=n_turns, count=share,
                seed=seed, tokenizer=tokenizer,
            ))
        random.Random(f"ppd-synthetic-order:{seed}").shuffle(out)
        return out
    profile, sep, shape = name.partition("-")
    if not sep:
        close = difflib.get_close_matches(name, synthetic_names())
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise ValueError(f"unknown synthetic workload {name!r}; {hint}expected e.g. "
                         "small-mid_bal, mixed, multi-4, wildchat (all: `ppd replay --help`)")
    return two_turn_conversations(_profile(profile), shape, count, seed=seed, tokenizer=tokenizer)
