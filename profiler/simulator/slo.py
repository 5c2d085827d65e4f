"""The SLO a turn is held to (issue #43's definition), and the attainment and goodput of a run.

A turn meets its SLO when it succeeds, its TTFT is at most max(0.5 s, 3 x the TTFT the same
turn gets alone on an idle cluster through its better route), and its TPOT is at most 50 ms
(a one-token answer has no TPOT and passes that part). The idle reference is relative on
purpose: a turn that brings 8,000 new tokens cannot be held to the TTFT of a 16-token
follow-up, so each turn is judged against what the hardware can do for it at best.

The reference is measured, not modelled: every conversation of the run is simulated alone
(one at a time, far apart in virtual time) on an idle 1P1D cluster of the same cost preset,
once with turns 2+ forced P->D and once forced local; a turn's reference is the lower of its
two TTFTs. Turn 1 goes P->D in both. `ppd sim plan` and any command that scores runs against
the SLO read it from here.

Replies are not decoded in the reference (`fast`, the default): a decoded token is one engine
step at batch 1, so decoding every reply alone costs ~100 times the prefills. Each reply is cut
to its first token and the rest comes back as new tokens of the next turn, so every prompt
keeps its length. P->D is unchanged by that (P never held the reply); local prefills the
reply's tokens it would have found cached on D, so its reference is at most that prefill
slower: a few ms per reply on an H100 against the 0.5 s floor (measured in
tests/profiler/simulator/test_slo.py). A timed trace's requests carry their recorded prompts,
so there the cut changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from proxy.shared.vocabulary import RouteKind

if TYPE_CHECKING:  # the simulator (numpy, the engine model) is imported when a reference runs
    from profiler.simulator.run import RunSpec
    from profiler.traces.request_records import RequestRecord

# (conversation id, turn) -> the turn's TTFT alone on an idle cluster, seconds
IdleTtfts = Mapping[tuple[str, int], float]
IDLE_LAYOUT = "1P1D"
IDLE_ROUTES = (RouteKind.PD, RouteKind.LOCAL)


@dataclass(frozen=True, slots=True)
class Slo:
    """The per-turn SLO: a TTFT bound relative to the idle reference, an absolute TPOT bound."""

    ttft_floor_s: float = 0.5
    ttft_factor: float = 3.0
    tpot_ms: float = 50.0

    def __post_init__(self) -> None:
        for name, value in (("TTFT floor", self.ttft_floor_s), ("TTFT factor", self.ttft_factor),
                            ("TPOT bound", self.tpot_ms)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"SLO {name} must be a finite number > 0 (got {value:g})")

    def ttft_bound_s(self, idle_ttft_s: float | None) -> float:
        """The TTFT a turn may take: the floor when its idle reference is unknown."""
        if idle_ttft_s is None:
            return self.ttft_floor_s
        return max(self.ttft_floor_s, self.ttft_factor * idle_ttft_s)

    def describe(self) -> str:
        return (f"a turn meets the SLO when it succeeds, its TTFT <= max("
                f"{self.ttft_floor_s:g} s, {self.ttft_factor:g} x its TTFT alone on an idle "
                f"cluster through its better route) and its TPOT <= {self.tpot_ms:g} ms")


def base_id(conversation_id: str) -> str:
    """A conversation's id without the `#k` a repeated draw adds (`workload.arrivals`)."""
    return conversation_id.split("#", 1)[0]


def meets(record: RequestRecord, idle: IdleTtfts, slo: Slo) -> bool:
    """Whether one turn met the SLO (a failure never does)."""
    if not record.success or record.ttft_s is None:
        return False
    reference = idle.get((base_id(record.conversation_id), record.turn))
    if record.ttft_s > slo.ttft_bound_s(reference):
        return False
    return record.tpot_s is None or record.tpot_s * 1000.0 <= slo.tpot_ms


def slo_summary(records: Sequence[RequestRecord], window_s: float, idle: IdleTtfts,
                slo: Slo) -> dict[str, float | int | None]:
    """slo_attainment (share of all turns that met it, None without turns), slo_met (count)
    and goodput_turns_s: turns that met it per second of the window the traffic arrived in
    (not of the run's wall time, which one long conversation's last turn can stretch)."""
    met = sum(1 for record in records if meets(record, idle, slo))
    return {"slo_met": met,
            "slo_attainment": met / len(records) if records else None,
            "goodput_turns_s": met / window_s if window_s > 0 else None}


def idle_ttfts(spec: RunSpec, *, fast: bool = True) -> dict[tuple[str, int], float]:
    """Every turn of the spec's conversations, its lowest TTFT alone on an idle 1P1D cluster
    of the spec's preset over IDLE_ROUTES (see the module docstring). A timed trace's
    requests are sent one at a time in their recorded order, so a continuation still finds
    the blocks of the request it continues."""
    from profiler.simulator.run import setup_for
    from profiler.simulator.virtual_cluster import Simulator
    from profiler.simulator.workload import Arrival, is_timed_dataset
    from proxy.config.policy_config import Policy, PolicyConfig

    timed = is_timed_dataset(spec.dataset)
    started, rename = _timed_alone(spec) if timed else (_conversations_alone(spec), None)
    if fast:
        started = [_first_tokens_only(conversation) for conversation in started]
    # Far enough apart that none can still run when the next starts: each turn at most one
    # timeout.
    gap_s = spec.timeout_s * max(len(c.turns) for c in started) + 60.0
    starts = [Arrival(index * gap_s, conversation) for index, conversation in enumerate(started)]
    best: dict[tuple[str, int], float] = {}
    for route in IDLE_ROUTES:
        alone = replace(spec, layout=IDLE_LAYOUT, policy=PolicyConfig(kind=Policy.PD),
                        forced_route=route, client_connections=None, fresh_arrivals=False)
        setup = setup_for(alone)
        if rename is not None:
            setup = replace(setup, proxy_names=rename.proxy_name)
        records = Simulator(setup).run(starts).records
        _keep_lowest(best, records if rename is None
                     else [rename.client_record(record) for record in records])
    return best


def _first_tokens_only(conversation: Any) -> Any:
    """The conversation with each reply cut to its first token and the rest of it sent back
    as new tokens of the next turn: every prompt keeps its length, the engines skip the
    decode steps (at batch 1, one step per token: 99% of an idle run's cost). See the module
    docstring for what that changes."""
    from profiler.simulator.workload import SimConversation, SimTurn

    turns = []
    carried = 0
    for turn in conversation.turns:
        turns.append(SimTurn(turn.n_user + carried, 1, turn.prompt))
        carried = turn.max_tokens - 1
    return SimConversation(conversation.id, tuple(turns), conversation.n_system)


def _conversations_alone(spec: RunSpec) -> list[Any]:
    """The conversations the run starts (the load draws a margin more), each once."""
    from profiler.simulator.run import arrival_seed
    from profiler.simulator.workload import arrivals, conversations_needed, load_conversations

    drawn = load_conversations(
        spec.dataset, conversations_needed(spec.qps, spec.duration_s), seed=spec.seed,
        max_turns=spec.max_turns, max_context_tokens=spec.max_context_tokens)
    started = {base_id(arrival.conversation.id): arrival.conversation
               for arrival in arrivals(drawn, spec.qps, spec.duration_s,
                                       seed=arrival_seed(spec))}
    return list(started.values())


def _timed_alone(spec: RunSpec) -> tuple[list[Any], Any]:
    """A timed trace window's requests in recorded order, and the workload that names them."""
    from profiler.simulator.workload import timed_workload
    from profiler.traces.mooncake import TraceWindow

    workload = timed_workload(spec.dataset, TraceWindow(spec.start_s, spec.duration_s, spec.qps),
                              seed=spec.seed, max_turns=spec.max_turns,
                              max_context_tokens=spec.max_context_tokens)
    ordered = sorted(workload.arrivals, key=lambda arrival: arrival.at)
    return [arrival.conversation for arrival in ordered], workload


def _keep_lowest(best: dict[tuple[str, int], float], records: Iterable[RequestRecord]) -> None:
    for record in records:
        if record.success and record.ttft_s is not None:
            key = (base_id(record.conversation_id), record.turn)
            best[key] = min(best.get(key, math.inf), record.ttft_s)
