"""The lease: one admission slot plus node slots, taken in one place and released once."""

from __future__ import annotations

import pytest

from proxy.shared.errors import Overloaded
from proxy.shared.vocabulary import Role
from proxy.upstream.backends import BackendPool
from proxy.upstream.lease import Admission
from tests.proxy.helpers import FakeClock


def test_admission_limit_and_exactly_once_release() -> None:
    pool = BackendPool()
    node = pool.add("http://d", Role.DECODE)
    admission = Admission(pool, limit=1)
    lease = admission.admit()
    lease.hold(node)
    assert (admission.open, node.in_flight) == (1, 1)
    with pytest.raises(Overloaded):
        admission.admit()
    lease.release()
    lease.release()
    assert (admission.open, node.in_flight) == (0, 0)
    with pytest.raises(RuntimeError):
        lease.hold(node)
    admission.admit().release()
    assert admission.open == 0


def test_settle_frees_the_slot_once_and_tells_the_breaker() -> None:
    pool = BackendPool(clock=FakeClock())
    p, d = pool.add("http://p", Role.PREFILL), pool.add("http://d", Role.DECODE)
    lease = Admission(pool).admit()
    lease.hold(p)
    lease.hold(d)
    lease.settle(d, ok=False)
    lease.settle(d, ok=False)  # counted once
    assert (d.in_flight, d.circuit.failures) == (0, 1)
    lease.settle(p, ok=True)
    assert p.in_flight == 0
    lease.release()
    assert (p.in_flight, d.in_flight, d.circuit.failures) == (0, 0, 1)


def test_hand_over_moves_everything_to_the_successor() -> None:
    pool = BackendPool()
    node = pool.add("http://d", Role.DECODE)
    admission = Admission(pool)
    lease = admission.admit()
    lease.hold(node)
    successor = lease.hand_over()
    lease.release()  # the original holds nothing any more
    assert (admission.open, node.in_flight, lease.held) == (1, 1, False)
    successor.release()
    assert (admission.open, node.in_flight, successor.held) == (0, 0, False)
    with pytest.raises(RuntimeError):
        lease.hand_over()
