"""The circuit breaker's rule, as pure functions of a node's `Circuit` and the time.

A node whose completions fail N times in a row (default 3) while its /health still answers 200
is *open*: it is not picked for `cooldown_s`. Then it is *half-open*: one request (the probe)
may go to it; if the probe succeeds the circuit closes, if it fails it opens again for another
cool-down. Any success closes the circuit and clears the count. A success is a leg the node
answered: a prefill, a whole reply, a stream to its end, or a 4xx (the request was at fault,
not the node). A failure: refused, reset, timed out, 5xx, or a stream cut short. A probe that
ends without a verdict (the client hung up) is abandoned, so the next request may probe.

The backend pool (`proxy.upstream.backends`) keeps one `Circuit` per node and applies these
transitions; this
module reads no clock (the time is passed in) and knows nothing of nodes or HTTP.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

DEFAULT_FAILURES = 3
DEFAULT_COOLDOWN_S = 10.0


class CircuitState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class Circuit:
    """One node's breaker state: consecutive failures, when it opened, whether a probe is out."""

    failures: int = 0
    opened_at: float | None = None
    probing: bool = False


CLOSED = Circuit()


@dataclass(frozen=True, slots=True)
class Breaker:
    """The rule: open after `failures` consecutive failures, probe after `cooldown_s`."""

    failures: int = DEFAULT_FAILURES
    cooldown_s: float = DEFAULT_COOLDOWN_S

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise ValueError("a breaker needs failures >= 1")
        if not self.cooldown_s >= 0:
            raise ValueError("a breaker needs cooldown_s >= 0")

    def state(self, circuit: Circuit, now: float) -> CircuitState:
        """Where the circuit stands at `now`."""
        if circuit.opened_at is None:
            return CircuitState.CLOSED
        if now < circuit.opened_at + self.cooldown_s:
            return CircuitState.OPEN
        return CircuitState.HALF_OPEN

    def admits(self, circuit: Circuit, now: float) -> bool:
        """Whether a request may be sent to the node now."""
        state = self.state(circuit, now)
        return state is CircuitState.CLOSED or (state is CircuitState.HALF_OPEN
                                                and not circuit.probing)

    def picked(self, circuit: Circuit, now: float) -> Circuit:
        """The node was picked for a request; in half-open, that request is the probe."""
        if self.state(circuit, now) is CircuitState.HALF_OPEN:
            return replace(circuit, probing=True)
        return circuit

    def succeeded(self, circuit: Circuit) -> Circuit:
        """A completion on the node succeeded: the circuit closes."""
        return CLOSED

    def failed(self, circuit: Circuit, now: float) -> Circuit:
        """A completion on the node failed: count it; open at the threshold or on a failed probe."""
        failures = circuit.failures + 1
        if circuit.probing or failures >= self.failures:
            return Circuit(failures, opened_at=now, probing=False)
        return replace(circuit, failures=failures)

    def abandoned(self, circuit: Circuit) -> Circuit:
        """A request ended without a verdict; if it was the probe, another may be sent."""
        return replace(circuit, probing=False) if circuit.probing else circuit
