"""`create_app`: the Quart app, thin handlers over the router, owning the upstream legs.

The legs (`proxy.upstream.legs`) are opened when serving starts, beside one pooled httpx client for
the health probes, and closed when it stops.

Routes: POST /v1/chat/completions, POST /v1/completions (served ahead of Quart by
`proxy.serving.endpoints`, the hot path), GET /v1/models, GET /health
(503 exactly while no route can be served: no healthy P and D, or replica, whose circuit is
not open), GET /metrics (Prometheus), GET /stats (JSON counters),
GET /sessions (admin: 404 while no --admin-key is set, 401 without it).

Forcing header `x-ppd-route: pd|local` (the profiler uses it): needs `authorization: Bearer
ADMIN_KEY` when an admin key is configured. Forcing `local` on a request that has nothing to
append to (turn 1, a new branch, or a session whose D is gone) runs it as P->D, and the
response's `x-ppd-route: pd` says so. Under policy replica the header is ignored.
With `--api-key`, the completion endpoints need `authorization: Bearer API_KEY` (the admin
key is accepted too).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import werkzeug.exceptions
from prometheus_client import CONTENT_TYPE_LATEST
from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from proxy.config.preflight import load_policy
from proxy.config.settings import ProxyConfig
from proxy.live.kv_health import KvEventCollector
from proxy.live.kv_health import health as kv_health
from proxy.live.load_meter import RateMeter
from proxy.live.view import LiveRuntime
from proxy.observability.metrics import ProxyMetrics
from proxy.observability.tracing import open_tracing
from proxy.responses.install import install as install_responses
from proxy.routing.router import Router
from proxy.serving.endpoints import CompletionsApp
from proxy.serving.server import serve_app
from proxy.sessions.open_store import open_store
from proxy.sessions.readback_book import ReadbackBook
from proxy.sessions.readbacks import MemoryReadbacks, Readbacks
from proxy.sessions.store import SessionStore, watch_store
from proxy.shared.errors import PayloadTooLarge, ProxyError, Unauthorized
from proxy.shared.tokens import token_counter
from proxy.shared.validate import bearer_matches
from proxy.shared.vocabulary import PRODUCT
from proxy.upstream.backends import BackendPool
from proxy.upstream.bounded_legs import BoundedLegs
from proxy.upstream.breaker import Breaker
from proxy.upstream.discovery import Discovery
from proxy.upstream.health import HealthMonitor
from proxy.upstream.httpx_legs import HttpxLegs, httpx_pool
from proxy.upstream.legs import Legs, LegsFactory, LegTimeouts
from proxy.upstream.transport import DefaultLegs

log = logging.getLogger("ppd.proxy")


@dataclass(slots=True)
class ProxyState:
    """The typed objects one app owns (reachable as app.extensions["ppd"])."""

    config: ProxyConfig
    pool: BackendPool
    sessions: SessionStore
    router: Router
    metrics: ProxyMetrics
    load: RateMeter
    discovery: Discovery | None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    legs: Legs | None = None  # the upstream legs (completions), open while serving
    client: httpx.AsyncClient | None = None  # health probes
    live: LiveRuntime | None = None  # policy live's subscribers and scraper
    exposition: Callable[[], bytes] | None = None  # /metrics; a worker's covers every worker
    # Headers every response carries, completions included (a worker's x-ppd-worker).
    response_headers: dict[str, str] = field(default_factory=dict)

    def can_serve(self) -> bool:
        """Whether the pool can serve requests now: a usable node of every role of one of
        the policy's `serving_roles` (live in a hybrid pool: a P->D pair or a replica)."""
        return any(self.pool.can_serve(roles) for roles in self.router.policy.serving_roles)


def build_state(config: ProxyConfig, clock: Callable[[], float]) -> ProxyState:
    """Assemble the pool, session store, policy and router from the config (loads table and
    tokenizer)."""
    policy = load_policy(config.policy)
    pool = BackendPool(config.nodes, breaker=Breaker(config.breaker_failures,
                                                     config.breaker_cooldown), clock=clock)
    sessions = open_store(config.session_store, config.session_ttl, config.max_sessions, clock)
    metrics = ProxyMetrics(config.policy.kind.value, sessions.live)
    watch_store(metrics.registry, sessions)
    load = RateMeter(config.load_window, clock)
    router = Router(pool, sessions, policy, token_counter(config.tokenizer), metrics, load, clock,
                    config.max_in_flight, config.request_timeout)
    if config.kv_readback_ttl is not None:
        router.readback = _readbacks(sessions, config.max_sessions, clock,
                                     config.limits.readback_book_bytes)
        router.readback_ttl = config.kv_readback_ttl
    metrics.watch(pool.snapshot, lambda: router.admission.open)
    live = (LiveRuntime(pool, config.kv_events, config.metrics_interval, clock,
                        config.kv_blocks, config.limits.kv_clock_skew)
            if policy.spec.needs.live_view or policy.spec.needs.view else None)
    if live is not None:
        metrics.registry.register(KvEventCollector(live.subscribers.subscribers))
        metrics.watch_node_load(lambda: live.signals.latest, clock)
    router.view = live.view if live is not None else None
    discovery = (Discovery(pool, config.discovery, config.heartbeat_timeout, clock,
                           config.discovery_token, insecure=config.discovery_insecure,
                           max_nodes=config.limits.discovery_max_nodes,
                           registrations_per_s=config.limits.discovery_registrations_per_s)
                 if config.discovery else None)
    return ProxyState(config, pool, sessions, router, metrics, load, discovery, live=live)


def _readbacks(sessions: SessionStore, max_entries: int,
               clock: Callable[[], float], max_bytes: int) -> Readbacks:
    """The readback book: in Redis beside the sessions when they are there (whichever worker or
    replica serves a session's next turn takes the entry), else in this process."""
    if sessions.shared:
        # The redis client is an optional dependency: imported only for a store that uses it.
        from proxy.sessions.redis_readbacks import RedisReadbacks
        from proxy.sessions.redis_store import RedisStore

        if isinstance(sessions, RedisStore):
            return RedisReadbacks(sessions, clock)
    return MemoryReadbacks(ReadbackBook(max_entries, clock, max_bytes))


def create_app(config: ProxyConfig, *, transport: httpx.AsyncBaseTransport | None = None,
               legs: LegsFactory | None = None,
               clock: Callable[[], float] = time.monotonic) -> Quart:
    """The proxy as an ASGI app; `transport` replaces the network (tests: the legs and the
    health probes go through it), `legs` how the legs are sent (default
    `proxy.upstream.transport.DefaultLegs`; a benchmark stack), `clock` time."""
    state = build_state(config, clock)
    app = Quart("ppd.proxy")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.config["RESPONSE_TIMEOUT"] = None  # streams last as long as generation does
    app.extensions[PRODUCT] = state

    @app.before_serving
    async def start() -> None:
        # The client's own Authorization is for the proxy; nodes get the backend key, if any.
        upstream_headers = ({"authorization": f"Bearer {config.backend_api_key}"}
                            if config.backend_api_key else {})
        timeouts = LegTimeouts(connect=config.connect_timeout, read=config.request_timeout)
        if legs is not None:
            state.legs = legs(timeouts, upstream_headers)
        elif transport is not None:
            state.legs = HttpxLegs(transport, timeouts, upstream_headers)
        else:
            state.legs = DefaultLegs(timeouts, upstream_headers)
        state.router.legs = BoundedLegs(state.legs, config.limits)  # answers bounded in bytes
        if config.otlp_traces_endpoint is not None:  # opentelemetry is imported only then
            completions.tracing = open_tracing(config.otlp_traces_endpoint)
        state.client = httpx.AsyncClient(
            transport=transport or httpx_pool(),  # idle connections: see proxy.upstream.legs
            headers=upstream_headers,
            timeout=httpx.Timeout(config.request_timeout, connect=config.connect_timeout),
        )
        await state.sessions.start()
        monitor = HealthMonitor(state.pool, state.client, config.health_interval)
        await monitor.check_all()
        table = state.router.policy.table
        if table is not None:
            for model in sorted(state.pool.models()):
                if warning := table.model_warning(model):
                    log.warning(warning)
        state.tasks.append(asyncio.create_task(_after(config.health_interval, monitor.run)))
        if state.live is not None:
            state.live.start()
        if state.discovery is not None:
            address = state.discovery.bind()
            log.info("discovery listening on %s", address)
            state.tasks.append(asyncio.create_task(state.discovery.run()))

    @app.after_serving
    async def stop() -> None:
        for task in state.tasks:
            task.cancel()
        for task in state.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        state.tasks.clear()
        if state.live is not None:
            await state.live.stop()
        await state.sessions.close()
        if state.legs is not None:
            await state.legs.aclose()
        if state.client is not None:
            await state.client.aclose()
        if completions.tracing is not None:
            completions.tracing.shutdown()  # flushes the spans not yet exported

    # The completion endpoints are served by proxy.serving.endpoints, ahead of Quart (the hot path).
    completions = CompletionsApp(config, state.router, app.asgi_app, state.response_headers)
    app.asgi_app = completions  # type: ignore[method-assign, assignment]

    @app.after_request
    async def label(response: Response) -> Response:
        response.headers.update(state.response_headers)
        return response

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [{"id": m, "object": "model", "owned_by": PRODUCT} for m in
                sorted(state.pool.models())]
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health() -> tuple[dict[str, Any], int]:
        ok = state.can_serve()
        body = {"status": "ok" if ok else "unavailable", "nodes": state.pool.snapshot()}
        return body, 200 if ok else 503

    @app.get("/metrics")
    async def metrics() -> Response:
        exposition = state.exposition or state.metrics.exposition
        return Response(exposition(), content_type=CONTENT_TYPE_LATEST)

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        rate = state.load.rate()
        return {**state.metrics.stats(), "sessions_live": state.sessions.live(),
                "request_rate": rate, "request_rate_unit": "requests (turns)/s",
                "backends": state.pool.snapshot(),
                **({"kv_events": kv_health(state.live.subscribers.subscribers)}
                   if state.live is not None else {})}

    @app.get("/sessions")
    async def sessions() -> dict[str, Any]:
        # Conversation ids and turn counts are other clients' data: only an admin sees them.
        if not config.admin_key:
            raise werkzeug.exceptions.NotFound(
                "/sessions is off: start the proxy with --admin-key to enable it")
        if not bearer_matches(request.headers.get("authorization"), config.admin_key):
            raise Unauthorized("/sessions needs authorization: Bearer ADMIN_KEY")
        return {"sessions": await state.sessions.snapshot()}

    # /v1/responses and /v1/conversations (proxy.responses), routed through the same router.
    install_responses(app, config, state.router, clock)
    _register_error_handlers(app)
    return app


async def _after(delay: float, job: Callable[[], Any]) -> None:
    await asyncio.sleep(delay)
    await job()


def _error(exc: ProxyError) -> Response:
    return Response(exc.body_bytes(), status=exc.status, headers=exc.headers,
                    content_type="application/json")


def _register_error_handlers(app: Quart) -> None:
    @app.errorhandler(ProxyError)
    async def proxy_error(exc: ProxyError) -> Response:
        return _error(exc)

    @app.errorhandler(RequestEntityTooLarge)
    async def too_large(_: RequestEntityTooLarge) -> Response:
        limit = app.config["MAX_CONTENT_LENGTH"]
        return _error(PayloadTooLarge(f"request body is over the {limit}-byte limit"))

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        error = ProxyError(exc.description or exc.name)
        body = error.to_openai_body()
        body["error"].update(type="invalid_request_error", code=exc.name.lower().replace(" ", "_"))
        return Response(json.dumps(body).encode(), status=exc.code or 500,
                        content_type="application/json")

    @app.errorhandler(Exception)
    async def unexpected(exc: Exception) -> Response:
        log.exception("unexpected error: %s", exc)
        return _error(ProxyError(f"internal proxy error: {type(exc).__name__}"))


def serve(config: ProxyConfig) -> None:
    """Run the proxy on config.host:config.port until SIGINT or SIGTERM (blocking)."""
    serve_app(create_app(config), config.host, config.port, config.shutdown_grace)
