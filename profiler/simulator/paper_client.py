"""The PPD paper's benchmark client, like for like (`ppd sim run|grid --client paper`).

Its script (scripts/benchmark/comprehensive_benchmark.py in the paper's repository) differs
from ppd's ideal client in three ways the simulator models (and the paper's proxy in front of
its nodes places conversations by hash, not by load: `sim_proxy.hashed_placement`, on with
this client):
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
  and the rest comes back as new ids. The table below holds both the tokenizer's part and
  the model's (a reply that runs into a special token under `ignore_eos` loses the rest);
- **fresh arrivals per run** (`--fresh-arrivals`, not a default): its Poisson gaps come from
  an unseeded `random.expovariate`, drawn again for every configuration, workload and QPS
  point, so two layouts at one point were measured on different arrivals
  (`run.arrival_seed`: with the flag each layout and policy its own seeded draw; without it
  the same arrivals on all, so a comparison sees the configurations' difference).
"""

from __future__ import annotations

import bisect
import enum


class ClientKind(enum.StrEnum):
    IDEAL = "ideal"  # ppd replay's: every turn sent when due, replies back as their own ids
    PAPER = "paper"  # the paper's script: 50 connections, its clock, text history


PAPER_CONNECTIONS = 50

# `python -m benchmarks.reply_retokenization --replies 3 --tokens 256` (2026-11-28, the only
# run of the model's part that finished here): SmolLM2-135M-Instruct answering 3 ShareGPT
# prompts greedily, never stopping at its end-of-text token (`ignore_eos`), each reply sent
# back as text as the paper's client does: mean share of a reply of n tokens that still hits
# the prefix cache (whole 16-token blocks). Both parts are in it: the tokenizer's (the block
# where the reply meets the text around it) and the model's - a special token the reply runs
# into under `ignore_eos` is dropped from the text vLLM returns (`skip_special_tokens`), so
# the hit ends there (one of the three replies opened with it: 0.00; two ran 256 tokens
# without one: 0.99, 1.00). Three replies are a small sample of that rate; past 256 tokens
# the share at 256 is carried (a longer reply is no less likely to meet one).
REPLY_HIT_SHARE: dict[int, float] = {32: 0.62, 64: 0.65, 128: 0.66, 256: 0.66}

# The tokenizer's part alone (`--canonical-only --replies 40 --tokens 512`: 40 of ShareGPT's
# assistant replies as the tokenizer's own ids): what a model that never emits a special
# token would keep - the upper bound `--client paper` used before 2026-11-28.
REPLY_HIT_SHARE_TOKENIZER: dict[int, float] = {32: 0.79, 64: 0.90, 128: 0.95, 256: 0.98,
                                               384: 0.98, 512: 0.99}


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
