"""The PPD paper's benchmark client, like for like (`ppd sim run|grid --client paper`).

Its script (scripts/benchmark/comprehensive_benchmark.py in the paper's repository) differs
from ppd's ideal client in three ways the simulator models:
- **50 connections** (`aiohttp.TCPConnector(limit=50, limit_per_host=50)`): at most 50 turns in
  flight; a turn due while all are busy waits for one;
- **its clock**: a turn's TTFT runs from when it was due (the clock starts before `post`), so
  the wait for a connection counts;
- **text history**: it calls the completions API with `prompt = history + "\\n" + new_input`,
  the history being the previous prompt plus the decoded reply text (`ignore_eos`, up to
  1,024 reply tokens). The server tokenizes that text again; the prefix cache hits on token
  ids, block by block, so the hit ends where the re-tokenized reply first differs from the
  ids it was generated as. `REPLY_HIT_SHARE` is that share, measured by
  `python -m benchmarks.reply_retokenization` (a real instruct model from an installed
  package, greedy, never stopping at its end-of-text token; docs/paper-reproduction.md), not
  fitted to any result: a reply keeps its ids for its first `kept_reply_tokens(n)` tokens
  and the rest comes back as new ids. The table below is the tokenizer's part (`--canonical-
  only`); the model's part (a reply that runs past its end-of-text token under `ignore_eos`)
  is measured by the same script without that flag, on a real model, when the machine allows.
"""

from __future__ import annotations

import bisect
import enum


class ClientKind(enum.StrEnum):
    IDEAL = "ideal"  # ppd replay's: every turn sent when due, replies back as their own ids
    PAPER = "paper"  # the paper's script: 50 connections, its clock, text history


PAPER_CONNECTIONS = 50

# `python -m benchmarks.reply_retokenization --canonical-only --replies 40 --tokens 512`
# (2026-11-28): 40 of ShareGPT's assistant replies as the SmolLM2 tokenizer's own ids, sent
# back as the paper's client does: mean share of a reply of n tokens that still hits the
# prefix cache (whole 16-token blocks). The tokenizer's part: what a model that emits its
# tokenizer's segmentation and stops before max_tokens loses (the blocks where the reply
# meets the text around it) - an upper bound for `ignore_eos` replies that run past the
# model's end-of-text token (docs/paper-reproduction.md).
REPLY_HIT_SHARE: dict[int, float] = {32: 0.79, 64: 0.90, 128: 0.95, 256: 0.98, 384: 0.98,
                                     512: 0.99}


def kept_reply_tokens(n: int) -> int:
    """Leading reply tokens that still hit the prefix cache when the reply of n tokens comes
    back as text: the measured share at the nearest measured length at or below n (the
    shortest for shorter replies; the longest for longer ones - the measurement says nothing
    past it, so its share is carried)."""
    if n <= 0 or not REPLY_HIT_SHARE:
        return 0
    lengths = sorted(REPLY_HIT_SHARE)
    index = bisect.bisect_right(lengths, n) - 1
    length = lengths[max(index, 0)]
    return min(n, int(REPLY_HIT_SHARE[length] * n))
