"""One request, start to finish: session -> tokens -> workload -> policy -> nodes -> legs.

No HTTP framework types here: the app hands in an `Incoming` and sends back the `Reply`.
Failover follows DESIGN "Backends": a failing P is skipped for another P; a D (or local D)
that fails before its first byte is marked unhealthy and the turn is redone as P->D on
another healthy D. Once bytes flow, nothing is retried and no error is sent inside the stream.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from proxy import forward, wire
from proxy.backends import Backend, BackendPool
from proxy.config import Policy
from proxy.errors import NoBackend, NotFound, Overloaded, ProxyError, UpstreamRejected
from proxy.forward import ReplyCapture, UpstreamStream
from proxy.load import RateMeter, RunningMean
from proxy.metrics import ProxyMetrics
from proxy.policies import Decision, Reason, RoutingPolicy
from proxy.route import Role, RouteKind, Workload
from proxy.sessions import Lookup, SessionLedger, Transcript
from proxy.tokens import TokenCounter
from proxy.validate import Endpoint

log = logging.getLogger("ppd.proxy")

# Output length assumed for requests without max_tokens until replies have been seen.
DEFAULT_EXPECTED_OUTPUT = 128


@dataclass(frozen=True, slots=True)
class Incoming:
    """A validated completion request (the app has checked auth and the body)."""

    endpoint: Endpoint
    body: dict[str, Any]
    session_id: str | None = None  # the x-session-id header
    forced: RouteKind | None = None  # the x-ppd-route header, already authorized


@dataclass(slots=True)
class Reply:
    """What the app sends back: a status, headers and a body (bytes or a relay)."""

    status: int
    headers: dict[str, str]
    body: bytes | Relay
    content_type: str = "application/json"


@dataclass(slots=True)
class _Served:
    route: RouteKind
    stream: UpstreamStream
    decode: Backend
    prefill: Backend | None


@dataclass(slots=True)
class _Turn:
    """Everything known about a turn in flight (for the bookkeeping at its end)."""

    incoming: Incoming
    transcript: Transcript
    lookup: Lookup
    workload: Workload
    started: float
    excluded: set[str] = field(default_factory=set)


class Relay:
    """The response body: upstream bytes unchanged, parsed on the side, cleaned up once.

    An upstream failure mid-stream ends the body quietly (the client already has a 200 and a
    partial answer; the error is counted). Closing the relay early, as Quart does when the
    client disconnects, closes the upstream response so vLLM aborts the request.
    """

    def __init__(self, stream: UpstreamStream, capture: ReplyCapture,
                 on_reply: Callable[[forward.Captured], None], on_release: Callable[[], None],
                 on_error: Callable[[ProxyError], None]) -> None:
        self._stream = stream
        self._chunks: AsyncGenerator[bytes, None] = stream.chunks()
        self._capture = capture
        self._on_reply = on_reply
        self._on_release = on_release
        self._on_error = on_error
        self._closed = False
        self._replied = False

    def __aiter__(self) -> Relay:
        return self

    async def __anext__(self) -> bytes:
        if self._closed:
            raise StopAsyncIteration
        try:
            chunk = await anext(self._chunks)
        except StopAsyncIteration:
            await self._close(finished=True)
            raise
        except ProxyError as exc:
            self._on_error(exc)
            await self._close(finished=False)
            raise StopAsyncIteration from exc
        self._capture.feed(chunk)
        if self._capture.stream_done:
            # Record the turn before the client can read `[DONE]`: a client that sends its next
            # turn at once must find the session already holding this reply.
            self._reply_once()
        return chunk

    def _reply_once(self) -> None:
        if not self._replied:
            self._replied = True
            self._on_reply(self._capture.finish())

    async def aclose(self) -> None:
        """Stop early: close upstream and release the node."""
        await self._close(finished=False)

    async def _close(self, finished: bool) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._chunks.aclose()
            await self._stream.aclose()
        finally:
            self._on_release()
            if finished:
                self._reply_once()


class Router:
    """Routes completion requests; owns no HTTP server, only the upstream legs."""

    def __init__(self, pool: BackendPool, ledger: SessionLedger, policy: RoutingPolicy,
                 counter: TokenCounter, metrics: ProxyMetrics, load: RateMeter,
                 clock: Callable[[], float], max_in_flight: int | None = None) -> None:
        self.pool = pool
        self.ledger = ledger
        self.policy = policy
        self.counter = counter
        self.metrics = metrics
        self.load = load
        self.clock = clock
        self.expected_output = RunningMean(DEFAULT_EXPECTED_OUTPUT)
        self.max_in_flight = max_in_flight
        self.in_flight = 0  # completion requests from admission until their body is done
        self.client: httpx.AsyncClient | None = None

    async def handle(self, incoming: Incoming) -> Reply:
        """Serve one completion request (raises ProxyError before any byte is sent)."""
        if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
            self.metrics.responded(Overloaded.status)
            raise Overloaded(f"the proxy is at its limit of {self.max_in_flight} open "
                             "requests; retry later")
        self.in_flight += 1
        try:
            reply = await self._handle(incoming)
        except BaseException:
            self.in_flight -= 1
            raise
        if not isinstance(reply.body, Relay):
            self.in_flight -= 1
        return reply

    async def _handle(self, incoming: Incoming) -> Reply:
        started = self.clock()
        self._check_model(incoming.body.get("model"))
        transcript = self._transcript(incoming)
        explicit = incoming.body.get("conversation_id", incoming.session_id)
        lookup = self.ledger.resolve(transcript, None if explicit is None else str(explicit))
        self.load.record()
        turn = _Turn(incoming, transcript, lookup, self._workload(incoming, transcript, lookup),
                     started)
        decision = self._decide(turn)
        try:
            served = await self._serve(turn, decision)
        except UpstreamRejected as exc:
            self.metrics.responded(exc.upstream_status)
            return Reply(exc.upstream_status, {}, exc.upstream_body, exc.content_type)
        except ProxyError as exc:
            self.metrics.responded(exc.status)
            raise
        self.metrics.routed(incoming.endpoint.value, served.route, decision, lookup.turn)
        self.metrics.first_byte(served.route, self.clock() - started)
        self.metrics.responded(served.stream.status)
        return self._reply(turn, served)

    def _check_model(self, model: Any) -> None:
        known = self.pool.models()
        if known and model is not None and model not in known:
            raise NotFound(f"model {model!r} is not served here (available: {sorted(known)})")

    @staticmethod
    def _transcript(incoming: Incoming) -> Transcript:
        if incoming.endpoint is Endpoint.CHAT:
            return Transcript.from_chat(incoming.body["messages"])
        return Transcript.from_prompt(incoming.body["prompt"])

    def _workload(self, incoming: Incoming, transcript: Transcript, lookup: Lookup) -> Workload:
        body = incoming.body
        held = lookup.session.held if lookup.continuation else None
        start = held.length if held is not None else 0
        # Only what is new is counted: D's part comes from the session (vLLM's usage).
        if incoming.endpoint is Endpoint.CHAT:
            n_in = self.counter.count_chat(body["messages"][start:])
        elif isinstance(body["prompt"], str):
            n_in = self.counter.count_text(body["prompt"][start:])
        else:
            n_in = sum(self.counter.count_text(p) if isinstance(p, str) else 1
                       for p in body["prompt"])
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        n_out = int(limit) if limit else round(self.expected_output.value)
        return Workload(lookup.turn, n_in, lookup.cached_tokens, n_out, self.load.rate())

    def _decide(self, turn: _Turn) -> Decision:
        session = turn.lookup.session
        can_local = turn.lookup.continuation and self.pool.is_usable(session.decode, Role.DECODE)
        forced = turn.incoming.forced
        if forced is None or self.policy.kind is Policy.REPLICA:
            return self.policy.decide(turn.workload, session.id, can_local)
        if forced is RouteKind.LOCAL and not can_local:
            # Nothing to append to (turn 1, or the session's D is gone): P->D is the only way.
            return Decision(RouteKind.PD, Reason.NO_HOME)
        return Decision(forced, Reason.FORCED)

    async def _serve(self, turn: _Turn, decision: Decision) -> _Served:
        if decision.kind is RouteKind.REPLICA:
            return await self._serve_replica(turn)
        if decision.kind is RouteKind.LOCAL:
            node = self.pool.get(turn.lookup.session.decode)
            if node is not None:
                try:
                    stream = await self._open(node, wire.local_body(turn.incoming.body), turn,
                                              wire.request_id())
                    return _Served(RouteKind.LOCAL, stream, node, None)
                except UpstreamRejected:
                    raise
                except ProxyError as exc:
                    self._failed(node, exc, mark_unhealthy=True, excluded=turn.excluded)
        return await self._serve_pd(turn)

    async def _serve_pd(self, turn: _Turn) -> _Served:
        session = turn.lookup.session
        p_excluded: set[str] = set()
        last: ProxyError | None = None
        while True:
            prefill = self.pool.pick(Role.PREFILL, session.prefill, frozenset(p_excluded))
            decode = self.pool.pick(Role.DECODE, session.decode, frozenset(turn.excluded))
            if prefill is None or decode is None:
                missing = "prefill" if prefill is None else "decode"
                raise last or NoBackend(f"no healthy {missing} node")
            request_id = wire.request_id(prefill.zmq_address, decode.zmq_address)
            try:
                with self.pool.busy(prefill):
                    kv = await forward.prefill(self._client(), prefill.base,
                                               turn.incoming.endpoint,
                                               wire.prefill_body(turn.incoming.body), request_id)
            except UpstreamRejected:
                raise
            except ProxyError as exc:
                last = exc
                # A refused connection means P is down; a 5xx may be this request's alone.
                self._failed(prefill, exc, mark_unhealthy=exc.kind == "connect",
                             excluded=p_excluded)
                continue
            try:
                stream = await self._open(decode, wire.decode_body(turn.incoming.body, kv),
                                          turn, request_id)
            except UpstreamRejected:
                raise
            except ProxyError as exc:
                last = exc
                self._failed(decode, exc, mark_unhealthy=True, excluded=turn.excluded)
                continue
            session.prefill, session.decode = prefill.url, decode.url
            return _Served(RouteKind.PD, stream, decode, prefill)

    async def _serve_replica(self, turn: _Turn) -> _Served:
        session = turn.lookup.session
        last: ProxyError | None = None
        while True:
            node = self.pool.pick(Role.REPLICA, session.decode, frozenset(turn.excluded))
            if node is None:
                raise last or NoBackend("no healthy replica node")
            try:
                stream = await self._open(node, wire.local_body(turn.incoming.body), turn,
                                          wire.request_id())
            except UpstreamRejected:
                raise
            except ProxyError as exc:
                last = exc
                self._failed(node, exc, mark_unhealthy=True, excluded=turn.excluded)
                continue
            session.decode = node.url
            return _Served(RouteKind.REPLICA, stream, node, None)

    async def _open(self, node: Backend, body: dict[str, Any], turn: _Turn,
                    request_id: str) -> UpstreamStream:
        # Counted in flight from the request until the relay releases it.
        node.in_flight += 1
        try:
            return await forward.open_stream(self._client(), node.base, turn.incoming.endpoint,
                                             body, request_id)
        except BaseException:
            node.in_flight -= 1
            raise

    def _failed(self, node: Backend, exc: ProxyError, *, mark_unhealthy: bool,
                excluded: set[str]) -> None:
        log.warning("%s %s failed (%s); failing over", node.role, node.url, exc.message)
        self.metrics.upstream_error(node.role.value, exc.kind)
        self.metrics.failover(node.role.value)
        excluded.add(node.url)
        if mark_unhealthy:
            self.pool.mark(node.url, healthy=False)

    def _client(self) -> httpx.AsyncClient:
        if self.client is None:
            raise RuntimeError("the router has no HTTP client (is the app serving?)")
        return self.client

    def _reply(self, turn: _Turn, served: _Served) -> Reply:
        stream_mode = bool(turn.incoming.body.get("stream", False))
        capture = ReplyCapture(turn.incoming.endpoint, stream_mode)

        def on_release() -> None:
            served.decode.in_flight -= 1
            self.in_flight -= 1

        def on_error(exc: ProxyError) -> None:
            log.warning("upstream %s failed mid-stream: %s", served.decode.url, exc.message)
            self.metrics.upstream_error(served.decode.role.value, "midstream")

        headers = {
            "x-ppd-route": served.route.value,
            "x-ppd-turn": str(turn.lookup.turn),
            "x-ppd-session": turn.lookup.session.id,
            "x-ppd-decode": served.decode.url,
        }
        if served.prefill is not None:
            headers["x-ppd-prefill"] = served.prefill.url
        if stream_mode:
            headers["cache-control"] = "no-cache"
        return Reply(served.stream.status, headers,
                     Relay(served.stream, capture, lambda captured: self._record(turn, captured),
                           on_release, on_error), served.stream.content_type)

    def _record(self, turn: _Turn, captured: forward.Captured) -> None:
        if not captured.complete:
            return  # D holds an unknown part; the session keeps what it knew
        usage = captured.usage or {}
        completion = usage.get("completion_tokens")
        if not isinstance(completion, int):
            completion = self.counter.count_text(captured.text)
        prompt = usage.get("prompt_tokens")
        if not isinstance(prompt, int):
            prompt = turn.workload.n_ctx + turn.workload.n_in
        self.expected_output.add(completion)
        held = turn.transcript.held_after(captured.text, prompt + completion)
        self.ledger.record_turn(turn.lookup, held)
