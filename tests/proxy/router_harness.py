"""A Router over `MockCluster` nodes (the transport seam) on a `FakeClock`: no sockets, no app."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from proxy.config.cluster_file import NodeSpec
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.live.load_meter import RateMeter
from proxy.observability.metrics import ProxyMetrics
from proxy.policies.routing import RoutingPolicy
from proxy.routing.router import Incoming, Reply, Router
from proxy.sessions.store import MemoryStore
from proxy.shared.tokens import token_counter
from proxy.shared.validate import Endpoint
from proxy.shared.vocabulary import Role, RouteKind
from proxy.upstream.backends import BackendPool
from proxy.upstream.breaker import Breaker
from proxy.upstream.httpx_legs import HttpxLegs
from proxy.upstream.legs import LegTimeouts
from proxy.upstream.relay import Relay
from tests.fakes.mock_vllm import MockCluster
from tests.proxy.helpers import FakeClock

ROLES = {"p": Role.PREFILL, "d": Role.DECODE, "r": Role.REPLICA}


@dataclass
class Harness:
    """The router under test, its cluster and its clock."""

    router: Router
    cluster: MockCluster
    clock: FakeClock

    @property
    def pool(self) -> BackendPool:
        return self.router.pool

    async def send(self, body: dict[str, Any], endpoint: Endpoint = Endpoint.CHAT,
                   forced: RouteKind | None = None) -> Reply:
        """One request through the router (its body not read yet)."""
        return await self.router.handle(Incoming(endpoint, body, forced=forced))

    async def ask(self, body: dict[str, Any], **kw: Any) -> tuple[Reply, bytes]:
        """One request, its body read to the end."""
        reply = await self.send(body, **kw)
        return reply, await read(reply)

    def in_flight(self) -> dict[str, int]:
        """Every node's in-flight count, and the router's open requests under "admitted"."""
        counts = {n.url: n.in_flight for n in self.pool.nodes()}
        return {**counts, "admitted": self.router.admission.open}

    def circuit(self, name: str) -> str:
        node = self.pool.get(self.cluster[name].url)
        assert node is not None
        return self.pool.circuit_state(node).value


async def read(reply: Reply) -> bytes:
    """A reply's whole body (a relay is read to its end, which closes it)."""
    if isinstance(reply.body, Relay):
        return b"".join([chunk async for chunk in reply.body])
    return reply.body


@asynccontextmanager
async def router_over(*names: str, policy: Policy = Policy.PD, breaker: Breaker | None = None,
                      max_in_flight: int | None = None) -> AsyncIterator[Harness]:
    """A router over mock nodes named p*, d*, r* (their first letter is their role)."""
    cluster = MockCluster(*names)
    clock = FakeClock(1000.0)
    pool = BackendPool([NodeSpec(cluster[n].url, ROLES[n[0]]) for n in names], breaker=breaker,
                       clock=clock)
    sessions = MemoryStore(3600.0, 1000, clock)
    metrics = ProxyMetrics(policy.value, sessions.live)
    router = Router(pool, sessions, RoutingPolicy(PolicyConfig(policy)), token_counter(None),
                    metrics, RateMeter(30.0, clock), clock, max_in_flight)
    metrics.watch(pool.snapshot, lambda: router.admission.open)
    router.legs = HttpxLegs(cluster.transport, LegTimeouts(connect=5.0, read=5.0))
    try:
        yield Harness(router, cluster, clock)
    finally:
        await router.legs.aclose()


def chat(*contents: str, **extra: Any) -> dict[str, Any]:
    """A chat body alternating user/assistant contents (starting with user)."""
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]
    return {"model": "fake-model", "messages": messages, "max_tokens": 16, **extra}


def text_of(body: bytes) -> str:
    """The assistant text of a chat body, streamed (SSE) or not."""
    if not body.startswith(b"data:"):
        return str(json.loads(body)["choices"][0]["message"]["content"])
    parts = []
    for event in body.decode().split("\n\n"):
        if event.startswith("data: {"):
            for choice in json.loads(event[6:]).get("choices", []):
                parts.append(choice.get("delta", {}).get("content") or "")
    return "".join(parts)


def events(body: bytes) -> list[Any]:
    """The data of every SSE event ("[DONE]" as a string)."""
    out: list[Any] = []
    for event in body.decode().split("\n\n"):
        if event.startswith("data: "):
            data = event[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out
