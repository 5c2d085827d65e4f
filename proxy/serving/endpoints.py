"""The completion endpoints, served ahead of Quart: the proxy's hot path.

POST /v1/chat/completions and /v1/completions are served here, without Quart's request
context, session cookie, routing and response wrappers, which cost about a third of the
proxy's CPU per request on benchmarks/proxy_overhead. The proxy's own server hands them over
directly (`CompletionsApp.direct`, answered on its connection: `proxy.serving.direct`); as an
ASGI app (any other server, a test's ASGI client) it serves them the same way and passes every
other request (and the lifespan) on to the Quart app. The handler stays thin: check the API
key and the forcing header, read the body under the size limit, parse and validate it, hand
it to the router, and send the `Reply`: bytes, or a relay streamed until it ends or the
client disconnects - which closes the relay, so the upstream response is closed and vLLM
aborts the request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from proxy.config.settings import ProxyConfig
from proxy.observability import tracing
from proxy.observability.logs import AccessEntry
from proxy.routing.router import Incoming, Router
from proxy.serving.http_server import DISCONNECT_EXTENSION, DisconnectSignal
from proxy.serving.responders import (
    AsgiResponder,
    DirectHandler,
    Headers,
    HeadSeen,
    Receive,
    Responder,
    Scope,
    Send,
)
from proxy.shared.errors import (
    BadRequest,
    HeadersTooLarge,
    MethodNotAllowed,
    PayloadTooLarge,
    ProxyError,
    Unauthorized,
)
from proxy.shared.explain import COSTS_HEADER
from proxy.shared.routes import FORCIBLE
from proxy.shared.validate import (
    Endpoint,
    bearer_matches,
    check_session_id,
    parse_json_object,
    refuse_many_messages,
    validate_body,
)
from proxy.upstream.relay import Relay

ASGIApp = Callable[..., Awaitable[None]]

log = logging.getLogger("ppd.proxy")

_PATHS = {endpoint.value: endpoint for endpoint in Endpoint}
_WANTED = (b"authorization", b"x-ppd-route", b"x-session-id", b"content-length")
# Every request's header lines together (names and values): past this, 431 (nginx's
# large_client_header_buffers and Node's default are 8-16 KB; a client needs far less).
MAX_HEADER_BYTES = 16 * 1024
# Answered when x-ppd-route came to a proxy without --admin-key (the header was ignored).
ROUTE_IGNORED = [(b"x-ppd-route-ignored", b"forcing a route needs the proxy's --admin-key")]
# Body fields that name vLLM's internals: a client's request_id would reach P and D verbatim
# (two clients sending one id collide in vLLM's request table; the proxy sets its own per
# leg, as x-request-id), and data_parallel_rank would pin a node's engine. Never forwarded.
# priority reorders vLLM's queue (--scheduling-policy priority): an admin's only.
INTERNAL_FIELDS = ("request_id", "data_parallel_rank")
ADMIN_FIELDS = ("priority",)


class _ClientGone(Exception):
    """The client disconnected before its request body arrived."""


class CompletionsApp:
    """Serves the completion endpoints; passes everything else to `fallback`."""

    def __init__(self, config: ProxyConfig, router: Router, fallback: ASGIApp,
                 response_headers: dict[str, str] | None = None) -> None:
        self._config = config
        self._router = router
        self._fallback = fallback
        # Added to every completion response; read per response, so it may change later.
        self._extra = response_headers if response_headers is not None else {}
        # `--otlp-traces-endpoint`'s tracer, set while serving (None: requests not traced).
        self.tracing: tracing.Tracing | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI: the completion endpoints here, everything else to the fallback app."""
        endpoint = _PATHS.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is not None:
            await self._answer(endpoint, scope, receive, AsgiResponder(send))
        elif scope["type"] == "http" and _header_bytes(scope) > MAX_HEADER_BYTES:
            await _send_error(AsgiResponder(send), _headers_too_large(), [])
        else:
            await self._fallback(scope, receive, send)

    def direct(self, scope: Scope) -> DirectHandler | None:
        """The handler for a completion POST, which the proxy's own server runs without ASGI
        (`proxy.serving.responders.DirectApp`); None for every other request."""
        endpoint = _PATHS.get(scope["path"]) if scope["method"] == "POST" else None
        if endpoint is None:
            return None
        return lambda scope, receive, responder: self._answer(endpoint, scope, receive,
                                                              responder)

    async def _answer(self, endpoint: Endpoint, scope: Scope, receive: Receive,
                      responder: Responder) -> None:
        # Added to every completion response; read per response, so it may change later.
        extra = [(name.encode("latin-1"), value.encode("latin-1"))
                 for name, value in self._extra.items()] if self._extra else []
        if _header_bytes(scope) > MAX_HEADER_BYTES:
            await _send_error(responder, _headers_too_large(), extra)
            return
        if self.tracing is None:
            await self._serve(endpoint, scope, receive, responder, extra)
            return
        trace = self.tracing.turn(endpoint.value)
        token = tracing.activate(trace)
        head = HeadSeen(responder)
        try:
            await self._serve(endpoint, scope, receive, head, extra)
        finally:
            tracing.deactivate(token)
            trace.finish(head.status, head.headers)

    async def _serve(self, endpoint: Endpoint, scope: Scope, receive: Receive,
                     responder: Responder, extra: Headers) -> None:
        if scope["method"] != "POST":
            refused = MethodNotAllowed(f"{scope['method']} is not allowed on {scope['path']}; "
                                       "use POST")
            refused.headers["allow"] = "POST"
            await _send_error(responder, refused, extra)
            return
        try:
            incoming = await self._incoming(endpoint, scope, receive)
        except _ClientGone:
            return
        except Exception as exc:
            error = _as_proxy_error(exc)
            # Refused before routing: still one access line (the router writes the others).
            AccessEntry(endpoint.value, status=error.status, error=error.message).emit()
            await _send_error(responder, error, extra)
            return
        if incoming.forced is None and not self._config.admin_key and any(
                name == b"x-ppd-route" for name, _ in scope["headers"]):
            extra = [*extra, *ROUTE_IGNORED]
        watch = _DisconnectWatch(scope, receive)
        try:
            reply = await self._router.handle(incoming)
            if COSTS_HEADER in reply.headers and not self._admin(scope):
                del reply.headers[COSTS_HEADER]
            head = _head(reply.headers, reply.content_type, extra)
            if isinstance(reply.body, Relay):
                await _stream(reply.status, head, reply.body, responder)
            else:
                await responder.whole(reply.status, head, reply.body)
            return
        except asyncio.CancelledError:
            if not watch.fired:
                raise
            watch.task.uncancel()  # our own cancellation: the client left, nothing to send
            return
        except Exception as exc:
            error = _as_proxy_error(exc)
        finally:
            watch.stop()
        if COSTS_HEADER in error.headers and not self._admin(scope):
            del error.headers[COSTS_HEADER]
        await _send_error(responder, error, extra)

    def _admin(self, scope: Scope) -> bool:
        """Whether the request carries the admin key (x-ppd-costs is for the operator)."""
        key = self._config.admin_key
        auth = next((value.decode("latin-1") for name, value in scope["headers"]
                     if name == b"authorization"), None)
        return bool(key) and bearer_matches(auth, key)

    async def _incoming(self, endpoint: Endpoint, scope: Scope, receive: Receive) -> Incoming:
        headers = {name.decode(): value.decode("latin-1") for name, value in scope["headers"]
                   if name in _WANTED}
        config = self._config
        # The body is read (up to --max-body-bytes) even when the headers refuse the request:
        # answering first lets the server close a connection the client is still writing to,
        # and the reset can destroy the answer before the client reads it.
        raw = await _read_body(receive, headers.get("content-length"), config.max_body_bytes)
        auth = headers.get("authorization")
        if config.api_key and not bearer_matches(auth, config.api_key, config.admin_key):
            raise Unauthorized("missing or invalid API key (authorization: Bearer KEY)")
        # Without an admin key nobody may force a route: the header is ignored (and the
        # answer says so, ROUTE_IGNORED), whatever it holds.
        forced = headers.get("x-ppd-route") if config.admin_key else None
        if forced is not None:
            if forced not in FORCIBLE:
                raise BadRequest(f"x-ppd-route must be one of {sorted(FORCIBLE)}, got {forced!r}")
            if not bearer_matches(auth, config.admin_key):
                raise Unauthorized("x-ppd-route needs authorization: Bearer ADMIN_KEY")
        session_id = headers.get("x-session-id")
        if session_id is not None:
            check_session_id(session_id, "x-session-id")
        refuse_many_messages(raw, config.limits.max_messages)
        body = parse_json_object(raw)
        validate_body(endpoint, body, config.limits.max_messages)
        if any(name in body for name in (*INTERNAL_FIELDS, *ADMIN_FIELDS)):
            admin = bool(config.admin_key) and bearer_matches(auth, config.admin_key)
            dropped = INTERNAL_FIELDS if admin else (*INTERNAL_FIELDS, *ADMIN_FIELDS)
            body = {k: v for k, v in body.items() if k not in dropped}
        return Incoming(endpoint, body, session_id, FORCIBLE[forced] if forced else None)


def _header_bytes(scope: Scope) -> int:
    size = 0
    for name, value in scope["headers"]:
        size += len(name) + len(value)
    return size


def _headers_too_large() -> HeadersTooLarge:
    return HeadersTooLarge(f"request headers are over the {MAX_HEADER_BYTES}-byte limit")


def _too_large(limit: int) -> PayloadTooLarge:
    # Built only when needed: an exception per request was 2.6% of the proxy's CPU.
    return PayloadTooLarge(f"request body is over the {limit}-byte limit")


async def _read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _head(headers: dict[str, str], content_type: str, extra: Headers) -> Headers:
    # latin-1 with replacement: a session id from the body may hold any character, and an
    # echoed header must never fail the response.
    raw = [(b"content-type", content_type.encode("latin-1", "replace"))]
    raw += [(name.encode("latin-1", "replace"), value.encode("latin-1", "replace"))
            for name, value in headers.items()]
    return raw + extra if extra else raw


def _as_proxy_error(exc: Exception) -> ProxyError:
    if isinstance(exc, ProxyError):
        return exc
    # A bug: answered as a 500, never a dropped connection.
    log.exception("unexpected error: %s", exc)
    return ProxyError(f"internal proxy error: {type(exc).__name__}")


async def _send_error(responder: Responder, error: ProxyError, extra: Headers) -> None:
    await responder.whole(error.status, _head(error.headers, "application/json", extra),
                          error.body_bytes())


async def _stream(status: int, head: Headers, relay: Relay, responder: Responder) -> None:
    """Send the relay's chunks as they come; however it ends, the relay is closed.

    The relay's first chunk is at hand (the router waited for it) and goes out with the
    response's head; a last chunk that arrived with the upstream's end goes out with the
    body's end: 2 writes (and packets) a reply fewer than one per message."""
    # The last chunk is written and the relay closed in one step of the loop only by a
    # responder that writes at once: else the turn is recorded before the end goes out.
    relay.record_late = relay.record_late and responder.writes_at_once
    try:
        await responder.head(status, head)
        async for chunk in relay:
            if relay.finished:
                await responder.chunk(chunk, False)
                return
            await responder.chunk(chunk, True)
        await responder.chunk(b"", False)
    except Exception as exc:  # a bug after the 200 went out: the body ends unfinished
        log.exception("unexpected error mid-stream: %s", exc)
    finally:
        await relay.aclose()


class _DisconnectWatch:
    """Cancels the current task when the client disconnects (the body was read already).

    A client that leaves while its request waits for P, or while its reply streams, cancels
    the request the way Quart did: leases are released and upstream requests closed. Under
    `proxy.serving.server`'s uvicorn the server says so itself (`DisconnectSignal`); under another
    server a task per request waits on `receive()` for the disconnect.
    """

    def __init__(self, scope: Scope, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.fired = False
        self._signal: DisconnectSignal | None = scope.get("extensions", {}).get(
            DISCONNECT_EXTENSION)
        self._watcher: asyncio.Future[None] | None = None
        if self._signal is not None:
            self._signal.callback = self._fire
        else:
            self._watcher = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._fire()

    def _fire(self) -> None:
        self.fired = True
        self.task.cancel()

    def stop(self) -> None:
        """Stop watching (before anything is sent after the watched part)."""
        if self._signal is not None:
            self._signal.callback = None
        if self._watcher is not None:
            self._watcher.cancel()
