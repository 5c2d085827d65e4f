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
import hashlib


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


# The script's `generate_prompt` wraps each turn's text in one of three formats, drawn with
# `rng.choice` from a generator seeded by the conversation's id and turn (the id holds a
# millisecond clock, so the draw is new every run): "User: ...\nAssistant:",
# "Question: ...\nAnswer:" and "<|user|>...<|assistant|>". Only the first holds "User:".
PROMPT_FORMATS = 3


def user_format(conversation_id: str, turn: int, seed: int) -> bool:
    """Whether the script wrote this turn's new text in its "User: ...\nAssistant:" format:
    one draw of three per (conversation, turn), stable for a seed (one per run)."""
    digest = hashlib.blake2b(f"{seed}/{conversation_id}/{turn}/format".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big") % PROMPT_FORMATS == 0


def proxy_conversation(conversation_id: str, turn: int, seed: int) -> tuple[str, int]:
    """The conversation and turn number the paper's proxy sees for a turn of the script's.

    Its proxy (comprehensive_proxy.py, `get_conversation_hash`) names a completions request
    by the md5 of the prompt's first "User:" segment (up to the next "Assistant:"), or of the
    prompt's first 200 characters when it holds no "User:"; the `conv_id` the script adds to
    turn 2's body is never read. A turn's prompt is the whole history plus its new text, so
    the first "User:" is that of the first turn written in the User format. While no turn
    is, the name is the first 200 characters: turn 1's, the same on every turn. So a turn
    whose new text is the conversation's first in the User format, after a turn 1 in one of
    the other two, is a new conversation to the proxy (2 in 9 of the script's two-turn
    conversations): it is placed afresh by hash and routed as a first turn (P->D; on
    replicas the hashed replica, which holds the history only by chance), and the turns
    after it continue that new one. Not modelled: a reply whose own text contains "User:"
    (what the model wrote; it would rename the conversation in the same way)."""
    first = next((k for k in range(1, turn + 1) if user_format(conversation_id, k, seed)), 1)
    if first == 1:
        return conversation_id, turn
    return f"{conversation_id}@{first}", turn - first + 1
