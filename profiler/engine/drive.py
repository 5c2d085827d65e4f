"""Drive one engine in virtual time: arrivals in, per-request timings out.

The smallest discrete-event loop over an `Engine`: three event sources (arrivals, the
engine's next step, the link's next transfer completion), always the earliest first, arrivals
before a step at the same instant so they join it. A P's held KV is released as soon as its
request finishes (there is no D here); a D's KV pulls go over `link` when given, else arrive
at once. The cluster simulator (issue 13) routes between several engines the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from profiler.engine.engine import Engine
from profiler.engine.requests import Phase, Request, RequestRejected
from profiler.engine.transfer import SharedLink


@dataclass(slots=True)
class Outcome:
    """One request as its client would see it (times in virtual seconds)."""

    id: str
    arrival: float
    token_times: list[float] = field(default_factory=list)
    finish: float | None = None
    num_cached_prompt: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    @property
    def tpot(self) -> float | None:
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)

    @property
    def finished(self) -> bool:
        return self.finish is not None and self.error is None


@dataclass(slots=True)
class SimResult:
    outcomes: dict[str, Outcome]
    num_steps: int
    end_time: float


def simulate(engine: Engine, arrivals: Iterable[tuple[float, Request]], *,
             link: SharedLink | None = None, kv_bytes_per_token: int = 0,
             until: float = math.inf) -> SimResult:
    """Run until every request is done (or `until`); deterministic for a given engine seed."""
    queue = sorted(arrivals, key=lambda pair: pair[0])
    outcomes: dict[str, Outcome] = {}
    next_arrival = 0
    num_steps = 0
    now = last = 0.0
    while True:
        arrival_at = queue[next_arrival][0] if next_arrival < len(queue) else math.inf
        step_at = engine.next_step_time()
        step_at = math.inf if step_at is None else max(step_at, now)
        link_at = link.next_completion() if link is not None else None
        link_at = math.inf if link_at is None else link_at
        now = min(arrival_at, step_at, link_at)
        if now == math.inf or now > until:
            break
        last = now
        if arrival_at == now:
            _, request = queue[next_arrival]
            next_arrival += 1
            outcome = outcomes[request.id] = Outcome(request.id, now)
            try:
                engine.submit(request, now)
            except RequestRejected as exc:
                outcome.error, outcome.finish = str(exc), now
        elif link_at == now:
            assert link is not None
            for request_id in link.advance(now):
                engine.kv_arrived(request_id)
        else:
            result = engine.step(now)
            num_steps += 1
            last = result.end
            for request_id in result.tokens:
                outcomes[request_id].token_times.append(result.end)
            for request_id, tokens in result.kv_pulls:
                if link is None:
                    engine.kv_arrived(request_id)
                else:
                    link.start(request_id, tokens * kv_bytes_per_token, now)
            for request_id in result.finished:
                seq = engine.sequence(request_id)
                outcome = outcomes[request_id]
                outcome.finish, outcome.num_cached_prompt = result.end, seq.num_cached_prompt
                if seq.request.send_kv:
                    engine.release_kv(request_id)
    for request_id, outcome in outcomes.items():
        seq_phase = _phase(engine, request_id)
        if outcome.error is None and seq_phase is Phase.FAILED:
            outcome.error = engine.sequence(request_id).error
    return SimResult(outcomes=outcomes, num_steps=num_steps, end_time=last)


def _phase(engine: Engine, request_id: str) -> Phase | None:
    try:
        return engine.sequence(request_id).phase
    except KeyError:
        return None
