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
  and the rest comes back as new ids.
"""

from __future__ import annotations

import bisect
import enum


class ClientKind(enum.StrEnum):
    IDEAL = "ideal"  # ppd replay's: every turn sent when due, replies back as their own ids
    PAPER = "paper"  # the paper's script: 50 connections, its clock, text history


PAPER_CONNECTIONS = 50

# benchmarks/reply_retokenization.py (SmolLM2-135M-Instruct, 8 ShareGPT prompts, greedy,
# ignore_eos): mean share of a reply of n tokens whose ids survive the text round trip and
# still hit the prefix cache (whole 16-token blocks).
REPLY_HIT_SHARE: dict[int, float] = {}


def kept_reply_tokens(n: int) -> int:
    """Leading reply tokens that still hit the prefix cache when the reply of n tokens comes
    back as text: the measured share at the nearest measured length at or below n (the
    shortest above it for shorter replies); past the longest measured reply, the hit stays
    what it was there (a mismatch ends the hit for good)."""
    if n <= 0 or not REPLY_HIT_SHARE:
        return 0
    lengths = sorted(REPLY_HIT_SHARE)
    if n >= lengths[-1]:
        return int(REPLY_HIT_SHARE[lengths[-1]] * lengths[-1])
    index = bisect.bisect_right(lengths, n) - 1
    length = lengths[max(index, 0)]
    return min(n, int(REPLY_HIT_SHARE[length] * n))
