"""The backend pool ledger and the health monitor."""

from __future__ import annotations

import httpx

from proxy.backends import BackendPool
from proxy.health import HealthMonitor
from proxy.route import Role


def test_least_in_flight_then_least_picked() -> None:
    pool = BackendPool()
    a, b = pool.add("http://a", Role.DECODE), pool.add("http://b", Role.DECODE)
    assert [pool.pick(Role.DECODE).url for _ in range(4)] == [  # type: ignore[union-attr]
        "http://a", "http://b", "http://a", "http://b"]
    with pool.busy(a):
        assert pool.pick(Role.DECODE) is b
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
