"""The circuit breaker's rule, pure: states and transitions on a given time."""

from __future__ import annotations

import pytest

from proxy.upstream.breaker import CLOSED, Breaker, Circuit, CircuitState


def test_opens_after_n_consecutive_failures_and_a_success_clears_the_count() -> None:
    rule = Breaker(failures=3, cooldown_s=10)
    circuit = rule.failed(rule.failed(CLOSED, now=1), now=2)
    assert (rule.state(circuit, 2), circuit.failures) == (CircuitState.CLOSED, 2)
    assert rule.succeeded(circuit) == CLOSED
    opened = rule.failed(circuit, now=3)
    assert opened == Circuit(3, opened_at=3)
    assert rule.state(opened, 12.9) is CircuitState.OPEN and not rule.admits(opened, 12.9)


def test_half_open_admits_one_probe_whose_verdict_decides() -> None:
    rule = Breaker(failures=1, cooldown_s=10)
    opened = rule.failed(CLOSED, now=0)
    assert rule.state(opened, 10) is CircuitState.HALF_OPEN and rule.admits(opened, 10)
    probing = rule.picked(opened, now=10)
    assert probing.probing and not rule.admits(probing, 11)
    assert rule.succeeded(probing) == CLOSED
    reopened = rule.failed(probing, now=11)
    assert rule.state(reopened, 20.9) is CircuitState.OPEN
    assert rule.state(reopened, 21) is CircuitState.HALF_OPEN
    # A probe that ended without a verdict lets the next request probe.
    assert rule.admits(rule.abandoned(probing), 11)
    assert rule.abandoned(CLOSED) == CLOSED


def test_a_failed_probe_reopens_even_under_a_higher_threshold() -> None:
    rule = Breaker(failures=5, cooldown_s=1)
    circuit = CLOSED
    for t in range(5):
        circuit = rule.failed(circuit, now=t)
    probing = rule.picked(circuit, now=10)
    assert rule.state(rule.failed(probing, now=10), 10.5) is CircuitState.OPEN
    assert rule.picked(CLOSED, now=0) == CLOSED  # picking a closed node changes nothing


@pytest.mark.parametrize(("failures", "cooldown"), [(0, 1.0), (1, -1.0)])
def test_rejects_nonsense(failures: int, cooldown: float) -> None:
    with pytest.raises(ValueError):
        Breaker(failures=failures, cooldown_s=cooldown)
