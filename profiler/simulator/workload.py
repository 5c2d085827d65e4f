"""What a simulated run replays: conversations as token counts, and their arrival times.

The conversations come from the same loaders as `ppd replay` (`profiler.traces`: synthetic
workloads, ShareGPT, trace files), counted once with a tokenizer; the simulator only needs each
turn's new user tokens and its output length. Arrivals are the replay client's own
`arrival_times` (seeded Poisson or gamma), so a simulated run and a real replay with the same
seed start the same conversations at the same offsets.

Synthetic conversations are cached per (dataset, seed, tokenizer) in the process: a grid runs
the same workload at ten loads, and the text generation costs more than a small simulation.

A timed block-hash trace (Mooncake's format, `profiler.traces.mooncake`) is not conversations
drawn at a rate: `timed_workload` makes each of its requests an arrival at its recorded,
time-scaled timestamp, a one-turn `SimConversation` whose turn carries its prompt as token ids
made from its block hashes at full scale (512-token blocks, `profiler.traces.block_tokens`), so
the engines' prefix caches see equal blocks as equal - across conversations too (the shared
system block). The simulator sends it at its arrival whether or not the request it continues
has answered; the proxy and the records know it as its conversation's turn (`TimedWorkload`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from profiler.engine.prefix_cache import block_hashes
from profiler.traces.arrivals import arrival_times
from profiler.traces.block_tokens import BlockTokens
from profiler.traces.conversation import Conversation
from profiler.traces.loader import TraceFilter, load_trace, sharegpt_package_file, trace_format
from profiler.traces.mooncake import BlockRecord, TimedRequest, TraceWindow, load_timed_trace
from profiler.traces.request_records import RequestRecord
from profiler.traces.synthetic import named_workload
from proxy.shared.tokens import EstimateTokenCounter, TokenCounter

SYNTHETIC_PREFIX = "synthetic:"
# The replay's default cap on max_tokens (ppd replay --max-tokens-cap).
DEFAULT_MAX_TOKENS_CAP = 1024
# Conversations generated per synthetic workload and cached: enough for 20 conversations/s
# over 10 s (the paper's largest point) with a Poisson margin; more are generated on demand.
_SYNTHETIC_BATCH = 320
# Conversations sampled per trace file and cached (ShareGPT takes ~10 s to parse).
_TRACE_BATCH = 600


@dataclass(frozen=True, slots=True)
class RecordedPrompt:
    """A recorded request's prompt as token ids, made when the turn is sent (a 300 s window of
    the Mooncake trace is 12 M prompt tokens: too many to hold as Python lists)."""

    record: BlockRecord
    tokens: BlockTokens = field(compare=False, repr=False)

    def ids(self) -> list[int]:
        return self.tokens.prompt(self.record)

    def hashes(self, block_size: int) -> tuple[int, ...]:
        """`prefix_cache.block_hashes` of `ids()` at an engine's block size, made once per
        process: each node a turn visits would hash its ~12,000 tokens again, and a grid
        sends the same window's prompts in run after run."""
        tokens = self.tokens
        return _prompt_hashes(self.record, tokens.vocab_size, tokens.scale, tokens.seed,
                              block_size)


# A recorded prompt's block hashes are ~750 ints: three 150 s windows of the Mooncake trace
# (~1,600 requests) are ~50 MB.
_MAX_HASHED_PROMPTS = 2048


@lru_cache(maxsize=_MAX_HASHED_PROMPTS)
def _prompt_hashes(record: BlockRecord, vocab_size: int | None, scale: float, seed: int,
                   block_size: int) -> tuple[int, ...]:
    ids = BlockTokens(vocab_size, scale, seed).prompt(record)
    return tuple(block_hashes(ids, block_size))


@dataclass(frozen=True, slots=True)
class SimTurn:
    """One turn as the simulator sees it: new user tokens and the output length asked for.

    prompt: a recorded trace's whole prompt (None: the history plus n_user fresh tokens).
    """

    n_user: int
    max_tokens: int
    prompt: RecordedPrompt | None = None


@dataclass(frozen=True, slots=True)
class SimConversation:
    """A conversation reduced to token counts (system prompt tokens go with turn 1)."""

    id: str
    turns: tuple[SimTurn, ...]
    n_system: int = 0


@dataclass(frozen=True, slots=True)
class Arrival:
    """A conversation starting at `at` seconds into the run."""

    at: float
    conversation: SimConversation


def to_sim(conversation: Conversation, tokenizer: TokenCounter, max_tokens_cap: int,
           max_turns: int | None = None) -> SimConversation:
    """Token counts of a conversation, with max_tokens chosen as the replay client does."""
    turns = conversation.turns[:max_turns] if max_turns else conversation.turns
    return SimConversation(
        id=conversation.id,
        turns=tuple(SimTurn(max(tokenizer.count(turn.user), 1),
                            min(turn.n_out_tokens or max_tokens_cap, max_tokens_cap))
                    for turn in turns),
        n_system=tokenizer.count(conversation.system) if conversation.system else 0,
    )


@lru_cache(maxsize=64)
def _synthetic(name: str, count: int, seed: int, tokenizer_name: str) -> tuple[SimConversation,
                                                                                ...]:
    tokenizer = EstimateTokenCounter()
    return tuple(to_sim(c, tokenizer, DEFAULT_MAX_TOKENS_CAP)
                 for c in named_workload(name, count, seed=seed, tokenizer=tokenizer))


def load_conversations(dataset: str, count: int, *, seed: int = 0,
                       tokenizer: TokenCounter | None = None,
                       max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP,
                       max_turns: int | None = None,
                       max_context_tokens: int | None = None) -> list[SimConversation]:
    """At least `count` conversations of dataset (`synthetic:NAME`, `sharegpt` or a path),
    or all a trace file has when it has fewer."""
    if dataset.startswith(SYNTHETIC_PREFIX):
        name = dataset.removeprefix(SYNTHETIC_PREFIX)
        if tokenizer is None and max_tokens_cap == DEFAULT_MAX_TOKENS_CAP:
            batch = max(_SYNTHETIC_BATCH, count)
            cached = _synthetic(name, batch, seed, EstimateTokenCounter.name)
            return [_cut(c, max_turns) for c in cached[:count]]
        tok = tokenizer or EstimateTokenCounter()
        return [to_sim(c, tok, max_tokens_cap, max_turns)
                for c in named_workload(name, count, seed=seed, tokenizer=tok)]
    path = sharegpt_package_file() if dataset == "sharegpt" else Path(dataset)
    if tokenizer is None:
        # The first `count` of a larger seeded sample are the sample of `count` (the loader
        # shuffles once and keeps in that order), so one cached load serves every load point.
        cached = _trace(str(path), max(count, _TRACE_BATCH), seed, max_tokens_cap,
                        max_context_tokens)
        return [_cut(c, max_turns) for c in cached[:count]]
    return list(_load(path, tokenizer, count, seed, max_tokens_cap, max_context_tokens,
                      max_turns))


@lru_cache(maxsize=8)
def _trace(path: str, count: int, seed: int, max_tokens_cap: int,
           max_context_tokens: int | None) -> tuple[SimConversation, ...]:
    return _load(Path(path), EstimateTokenCounter(), count, seed, max_tokens_cap,
                 max_context_tokens, None)


def _load(path: Path, tokenizer: TokenCounter, count: int, seed: int, max_tokens_cap: int,
          max_context_tokens: int | None, max_turns: int | None) -> tuple[SimConversation, ...]:
    trace = load_trace(path, tokenizer=tokenizer, sample=count, seed=seed,
                       filters=TraceFilter(max_context_tokens=max_context_tokens))
    if not trace.conversations:
        raise ValueError(f"no conversation of {path} passes the filters "
                         f"({trace.records} records, format {trace.format})")
    return tuple(to_sim(c, tokenizer, max_tokens_cap, max_turns) for c in trace.conversations)


def _cut(conversation: SimConversation, max_turns: int | None) -> SimConversation:
    if max_turns is None or len(conversation.turns) <= max_turns:
        return conversation
    return SimConversation(conversation.id, conversation.turns[:max_turns],
                           conversation.n_system)


def conversations_needed(qps: float, duration_s: float) -> int:
    """Enough conversations that Poisson arrivals almost never repeat one (as the replay)."""
    expected = qps * duration_s
    return math.ceil(expected + 4 * math.sqrt(expected) + 10)


def arrivals(conversations: list[SimConversation], qps: float, duration_s: float, *,
             seed: int = 0, burstiness: float = 1.0,
             max_conversations: int | None = None) -> list[Arrival]:
    """Conversations at the replay client's arrival times; a repeated one gets a new id
    (`ID#k`), as the replay client gives it, so the proxy sees a new session."""
    if not conversations:
        raise ValueError("no conversations to simulate")
    times = arrival_times(qps, duration_s, random.Random(seed), burstiness=burstiness,
                          max_count=max_conversations)
    out = []
    for index, at in enumerate(times):
        conversation = conversations[index % len(conversations)]
        cycle = index // len(conversations)
        if cycle:
            conversation = SimConversation(f"{conversation.id}#{cycle}", conversation.turns,
                                           conversation.n_system)
        out.append(Arrival(at, conversation))
    return out


def is_timed_dataset(dataset: str) -> bool:
    """Whether a dataset is a timed block-hash trace file (arrivals and prompts recorded)."""
    if dataset.startswith(SYNTHETIC_PREFIX) or dataset == "sharegpt":
        return False
    path = Path(dataset)
    return path.is_file() and _timed_format(str(path), path.stat().st_mtime)


@lru_cache(maxsize=32)
def _timed_format(path: str, mtime: float) -> bool:
    return trace_format(path).timed


@dataclass(frozen=True, slots=True)
class TimedWorkload:
    """A timed trace's requests as arrivals, and the conversation and turn of each.

    Each request is its own one-turn `SimConversation` (its id `mooncake-N`, N its record), so
    turns of one conversation overlap when the trace says they do; `proxy_name` gives the
    proxy its conversation and turn (`SimSetup.proxy_names`), `client_record` the records."""

    arrivals: list[Arrival]
    names: dict[str, tuple[str, int]]  # request's SimConversation id -> (conversation, turn)

    def proxy_name(self, request_id: str, turn: int) -> tuple[str, int]:
        return self.names[request_id]

    def client_record(self, record: RequestRecord) -> RequestRecord:
        conversation, turn = self.names[record.conversation_id]
        return replace(record, conversation_id=conversation, turn=turn)


def timed_workload(dataset: str, window: TraceWindow, *, seed: int = 0,
                   max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP,
                   max_turns: int | None = None,
                   max_context_tokens: int | None = None) -> TimedWorkload:
    """The window's requests at their recorded (time-scaled) arrivals, prompts at full scale;
    max_tokens is the recorded output length, capped as the replay caps it."""
    # parsed once per process for every time scale: a grid runs one window at several
    requests = _timed_requests(dataset, TraceWindow(window.start_s, window.duration_s))
    tokens = BlockTokens(seed=seed)
    out: list[Arrival] = []
    names: dict[str, tuple[str, int]] = {}
    for request in requests:
        record = request.record
        if max_turns is not None and request.turn > max_turns:
            continue
        if max_context_tokens is not None and record.input_length > max_context_tokens:
            continue
        turn = SimTurn(request.new_tokens, min(max(record.output_length, 1), max_tokens_cap),
                       RecordedPrompt(record, tokens))
        name = f"mooncake-{record.index}"
        names[name] = (request.conversation, request.turn)
        out.append(Arrival(request.arrival_s / window.time_scale,
                           SimConversation(name, (turn,))))
    if not out:
        raise ValueError(f"no request of {dataset} in the window passes the filters")
    return TimedWorkload(out, names)


@lru_cache(maxsize=8)
def _timed_requests(dataset: str, window: TraceWindow) -> tuple[TimedRequest, ...]:
    return tuple(load_timed_trace(dataset, window))
