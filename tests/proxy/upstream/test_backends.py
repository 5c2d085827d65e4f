"""The backend pool ledger and the health monitor."""

from __future__ import annotations

import httpx

from proxy.shared.vocabulary import Role
from proxy.upstream.backends import BackendPool
from proxy.upstream.breaker import Breaker
from proxy.upstream.health import TIMEOUTS_BEFORE_DOWN, HealthMonitor
from tests.proxy.helpers import FakeClock


def test_least_in_flight_then_least_picked() -> None:
    pool = BackendPool()
    a, b = pool.add("http://a", Role.DECODE), pool.add("http://b", Role.DECODE)
    assert [pool.pick(Role.DECODE).url for _ in range(4)] == [  # type: ignore[union-attr]
        "http://a", "http://b", "http://a", "http://b"]
    pool.occupy(a)
    assert pool.pick(Role.DECODE) is b
    pool.vacate(a)
    assert a.in_flight == 0


def test_sticky_preference_until_unhealthy_or_excluded() -> None:
    pool = BackendPool()
    pool.add("http://a", Role.DECODE)
    pool.add("http://b", Role.DECODE)
    for _ in range(3):
        assert pool.pick(Role.DECODE, prefer="http://b").url == "http://b"  # type: ignore[union-attr]
    pool.mark("http://b", healthy=False)
    assert pool.pick(Role.DECODE, prefer="http://b").url == "http://a"  # type: ignore[union-attr]
    pool.mark("http://b", healthy=True)
    assert pool.pick(Role.DECODE, prefer="http://b",
                     exclude=frozenset({"http://b"})).url == "http://a"  # type: ignore[union-attr]
    assert pool.pick(Role.PREFILL) is None
    assert pool.pick(Role.DECODE, prefer="http://a") is not None


async def test_health_monitor_marks_down_and_up_and_reads_models() -> None:
    state = {"healthy": False}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200 if state["healthy"] else 503)
        return httpx.Response(200, json={"data": [{"id": "m1"}, {"id": "m2"}]})

    pool = BackendPool()
    node = pool.add("http://d:1/", Role.DECODE)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        monitor = HealthMonitor(pool, client, interval=60)
        assert await monitor.check(node) is False
        assert not pool.can_serve([Role.DECODE])
        state["healthy"] = True
        await monitor.check_all()
    assert node.healthy and pool.can_serve([Role.DECODE])
    assert pool.models() == {"m1", "m2"}


async def test_a_slow_node_is_down_only_after_consecutive_timeouts() -> None:
    state = {"slow": True}

    def handler(request: httpx.Request) -> httpx.Response:
        if state["slow"]:
            raise httpx.ReadTimeout("busy prefilling", request=request)
        return httpx.Response(200, json={"data": []})

    pool = BackendPool()
    node = pool.add("http://p:1", Role.PREFILL)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        monitor = HealthMonitor(pool, client, interval=60)
        assert [await monitor.check(node) for _ in range(TIMEOUTS_BEFORE_DOWN)] == [
            True] * (TIMEOUTS_BEFORE_DOWN - 1) + [False]
        assert not node.healthy
        state["slow"] = False
        assert await monitor.check(node) is True
        state["slow"] = True  # the count starts again after an answer
        assert await monitor.check(node) is True


async def test_a_refused_connection_is_down_at_once() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    pool = BackendPool()
    node = pool.add("http://p:1", Role.PREFILL)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        assert await HealthMonitor(pool, client, interval=60).check(node) is False
    assert not node.healthy


def test_an_open_circuit_keeps_a_healthy_node_out_until_its_probe() -> None:
    clock = FakeClock()
    pool = BackendPool(breaker=Breaker(failures=2, cooldown_s=5), clock=clock)
    a, b = pool.add("http://a", Role.DECODE), pool.add("http://b", Role.DECODE)
    pool.failed(a)
    assert pool.is_usable("http://a", Role.DECODE)
    pool.failed(a)
    assert a.healthy and not pool.is_usable("http://a", Role.DECODE)
    assert [pool.pick(Role.DECODE, prefer="http://a") for _ in range(2)] == [b, b]
    assert pool.take("http://a", Role.DECODE) is None
    assert {n["url"]: n["circuit"] for n in pool.snapshot()} == {"http://a": "open",
                                                                 "http://b": "closed"}
    clock.now = 5
    assert pool.take("http://a", Role.DECODE) is a  # the probe
    assert pool.pick(Role.DECODE, prefer="http://a") is b  # one probe at a time
    pool.succeeded(a)
    assert pool.pick(Role.DECODE, prefer="http://a") is a
