"""`install`: the Responses API routes on the proxy's app, and the store they use (beside
the sessions: this process, or the Redis of `--session-store`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from quart import Quart

from proxy.config.settings import ProxyConfig
from proxy.responses.conversations import Conversations
from proxy.responses.endpoints import responses_blueprint
from proxy.responses.service import ResponsesService
from proxy.responses.store import Bounds, MemoryResponses, ResponseStore
from proxy.routing.router import Router
from proxy.sessions.store import MEMORY


def open_responses(config: ProxyConfig, clock: Callable[[], float]) -> ResponseStore:
    """The response store beside the sessions: in this process, or in their Redis."""
    bounds = Bounds(config.max_responses, config.response_ttl, config.max_response_bytes)
    if config.session_store == MEMORY:
        return MemoryResponses(bounds, clock)
    from proxy.responses.redis_store import RedisResponses  # redis: an optional dependency

    return RedisResponses(config.session_store, bounds, time.time)


def install(app: Quart, config: ProxyConfig, router: Router,
            clock: Callable[[], float]) -> ResponseStore:
    """Serve /v1/responses and /v1/conversations on app; the store, opened with the app."""
    store = open_responses(config, clock)
    service = ResponsesService(router, store, config.limits.max_messages)
    app.register_blueprint(responses_blueprint(
        service, Conversations(store), lambda: (config.api_key, config.admin_key)))
    app.before_serving(store.start)
    app.after_serving(store.close)
    return store
