"""Periodic health checks: GET /health and /v1/models on every node, as a background task.

A node that answers /health with an error, or refuses the connection, is down at once. A node
that is merely slow to answer is busy, not dead: a vLLM server on one CPU core can take seconds
to answer while it prefills a long batch, so a timeout marks it down only after
TIMEOUTS_BEFORE_DOWN consecutive ones (a request it refuses still marks it down at once).
Health is not the whole story: a node that answers /health but fails its completions is taken
out by its circuit breaker (`proxy.upstream.breaker`), which a passing health check does not close.
Every change of a node's state is logged at WARNING with its reason (the status code, the
connection refused, the timeouts), so an operator sees why a node left the pool.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from proxy.upstream.backends import Backend, BackendPool

log = logging.getLogger("ppd.proxy.health")

CHECK_TIMEOUT_S = 5.0
TIMEOUTS_BEFORE_DOWN = 3


class HealthMonitor:
    """Marks nodes healthy or not from their /health answer and refreshes their model lists."""

    def __init__(self, pool: BackendPool, client: httpx.AsyncClient, interval: float) -> None:
        self._pool = pool
        self._client = client
        self._interval = interval
        self._timeouts: dict[str, int] = {}  # url -> consecutive timed-out checks

    async def check(self, node: Backend) -> bool:
        """Check one node now; True iff it answered /health with 200."""
        reason = "/health answered 200"
        try:
            response = await self._client.get(f"{node.base}/health", timeout=CHECK_TIMEOUT_S)
            healthy = response.status_code == 200
            if not healthy:
                reason = _status_reason(response.status_code)
            else:
                models = await self._client.get(f"{node.base}/v1/models",
                                                timeout=CHECK_TIMEOUT_S)
                if models.status_code == 200:
                    data = models.json().get("data", [])
                    node.models = tuple(str(m["id"]) for m in data
                                        if isinstance(m, dict) and "id" in m)
        except httpx.TimeoutException as exc:
            timeouts = self._timeouts[node.url] = self._timeouts.get(node.url, 0) + 1
            log.debug("health check of %s timed out (%d in a row): %s", node.url, timeouts, exc)
            healthy = node.healthy and timeouts < TIMEOUTS_BEFORE_DOWN
            reason = (f"/health timed out {timeouts} time(s) in a row "
                      f"(> {CHECK_TIMEOUT_S:g} s each)")
        except httpx.ConnectError as exc:
            log.debug("health check of %s failed: %s", node.url, exc)
            healthy, reason = False, f"connection refused or unreachable ({exc or 'ConnectError'})"
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.debug("health check of %s failed: %s", node.url, exc)
            healthy, reason = False, f"{type(exc).__name__}: {exc}"
        else:
            self._timeouts.pop(node.url, None)
        if healthy != node.healthy:
            log.warning("node %s (%s) is now %s: %s", node.url, node.role.value,
                        "healthy" if healthy else "unhealthy", reason)
        self._pool.mark(node.url, healthy)
        return healthy

    async def check_all(self) -> None:
        """Check every node concurrently."""
        await asyncio.gather(*(self.check(node) for node in self._pool.nodes()))

    async def run(self) -> None:
        """Check every `interval` seconds until cancelled."""
        while True:
            await self.check_all()
            await asyncio.sleep(self._interval)


def _status_reason(status: int) -> str:
    if status == 404:
        return ("/health answered 404: is the URL the server's base URL, without /v1, "
                "of a vLLM server?")
    return f"/health answered {status}"
