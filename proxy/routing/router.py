"""One request, start to finish: session -> tokens -> workload -> policy -> nodes -> legs.

No HTTP framework types here: the app hands in an `Incoming` and sends back the `Reply`.
Each request holds a `Lease` (admission + node slots) from admission until its body is done.
Failover (`proxy.routing.failover`) follows docs/architecture.md: a failing P is skipped for
another P; a
D (or local D, or replica) that fails before the client got anything is skipped, and the turn
is redone as P->D on another usable D - P included, so a D never gets kv_transfer_params that
another D may already have consumed. Non-streamed replies are read whole before the status is
sent; a streamed reply that breaks after its first byte ends with an in-band error event
(`proxy.upstream.relay`). Either way an unfinished turn is not recorded as held by the session.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from proxy.live.load_meter import RateMeter, RunningMean
from proxy.live.view import LiveView, tag_session
from proxy.observability import tracing
from proxy.observability.logs import AccessEntry
from proxy.observability.metrics import ProxyMetrics
from proxy.policies.routing import RoutingPolicy
from proxy.readback import protocol as readback
from proxy.readback.protocol import HeldKV
from proxy.routing import readback_legs, turn_machine, turn_plan
from proxy.routing.failover import Failover, charge
from proxy.routing.turn_machine import TurnMachine
from proxy.routing.turn_plan import Attempt, Pick
from proxy.routing.turn_state import Incoming, Reply, Served, TurnInFlight, over_budget
from proxy.sessions.readbacks import Readbacks
from proxy.sessions.session import Lookup, Transcript
from proxy.sessions.store import SessionStore
from proxy.shared import explain
from proxy.shared.completion import Captured, ReplyCapture
from proxy.shared.errors import BudgetExhausted, NotFound, Overloaded, ProxyError, UpstreamError
from proxy.shared.tokens import (
    TokenCounter,
    new_input_tokens,
    requested_output_tokens,
    turn_usage,
)
from proxy.shared.validate import Endpoint
from proxy.shared.vocabulary import Reason, RouteKind, Workload
from proxy.upstream import forward, pd_protocol
from proxy.upstream.backends import Backend, BackendPool
from proxy.upstream.deadline import Deadline, DeadlineExceeded, guarded
from proxy.upstream.forward import Answer, UpstreamStream
from proxy.upstream.lease import Admission, Lease
from proxy.upstream.legs import Legs
from proxy.upstream.relay import Relay, StreamLimits

log = logging.getLogger("ppd.proxy")

# Output length assumed for requests without max_tokens until replies have been seen.
DEFAULT_EXPECTED_OUTPUT = 128


class Router:
    """Routes completion requests; owns no HTTP server, only the upstream legs."""

    def __init__(self, pool: BackendPool, sessions: SessionStore, policy: RoutingPolicy,
                 counter: TokenCounter, metrics: ProxyMetrics, load: RateMeter,
                 clock: Callable[[], float], max_in_flight: int | None = None,
                 request_timeout: float | None = None) -> None:
        self.pool = pool
        self.sessions = sessions
        self.policy = policy
        self.counter = counter
        self.metrics = metrics
        self.load = load
        self.clock = clock
        self.expected_output = RunningMean(DEFAULT_EXPECTED_OUTPUT)
        self.admission = Admission(pool, max_in_flight)
        # The whole request's budget, stream included (`--request-timeout`); None: unbounded.
        self.request_timeout = request_timeout
        self.legs: Legs | None = None  # the upstream legs (`proxy.upstream.legs`), set by the app
        # The cluster now (proxy.live.view), for a policy that reads it (live, Needs.view).
        self.view: LiveView | None = None
        # What each session's D keeps for a readback (None: the nodes do not offer it; shared
        # by every process when the sessions are), and for how long D keeps it
        # (`--kv-readback-ttl`, cluster.json's kv_readback_ttl_s).
        self.readback: Readbacks | None = None
        self.readback_ttl = 0.0

    async def handle(self, incoming: Incoming) -> Reply:
        """Serve one completion request (raises ProxyError before any byte is sent).

        Every request gets one access line (`proxy.observability.logs`): here for an error or a
        whole
        answer, when the relay closes for a stream."""
        started = self.clock()
        access = AccessEntry(incoming.endpoint, stream=incoming.stream)
        try:
            lease = self.admission.admit()
        except Overloaded as exc:
            self.metrics.responded(exc.status)
            access.finish(exc.status, self.clock() - started, exc.message)
            raise
        try:
            reply = await self._handle(incoming, lease, access, started)
        except ProxyError as exc:
            access.finish(exc.status, self.clock() - started, exc.message)
            raise
        finally:
            lease.release()  # nothing left to release once a relay took the lease over
        if not isinstance(reply.body, Relay):
            access.finish(reply.status, self.clock() - started)
        return reply

    async def _handle(self, incoming: Incoming, lease: Lease, access: AccessEntry,
                      started: float) -> Reply:
        self._check_model(incoming.body.get("model"))
        transcript = incoming.transcript()
        explicit = incoming.body.get("conversation_id", incoming.session_id)
        lookup = await self.sessions.resolve(transcript,
                                             None if explicit is None else str(explicit))
        self.load.record()
        deadline = None if self.request_timeout is None else Deadline(self.request_timeout)
        # vLLM tags the blocks it stores with the session; a client's own `session_id` never
        # reaches a node, under any policy (it would name another session's blocks).
        if self.view is not None or "session_id" in incoming.body:
            incoming = replace(incoming, body=tag_session(incoming.body, lookup.session.id))
        workload = self._workload(incoming, transcript, lookup)
        turn = TurnInFlight(incoming, transcript, lookup, workload, started,
                            Failover(self.pool, lease, self.metrics, deadline), access)
        access.session, access.turn = turn.session_label, lookup.turn
        relayed = False
        try:
            reply = await self._route(turn, lease)
            relayed = isinstance(reply.body, Relay)
        finally:
            if deadline is not None and not relayed:
                deadline.close()  # a relay closes it when its stream ends
        return reply

    async def _route(self, turn: TurnInFlight, lease: Lease) -> Reply:
        incoming, lookup, access, started = turn.incoming, turn.lookup, turn.access, turn.started
        view = self.view
        with tracing.deciding() as decided:
            plan = turn_plan.plan_turn(
                self.policy, self.pool, lookup, turn.workload, incoming.forced,
                view.state if view is not None else None,
                readback=await readback_legs.status(self.readback,
                                                    self.policy.spec.needs.readback, lookup,
                                                    incoming.forced),
                survey=view.cluster if view is not None else None)
            decided.record(plan.decision)
        decision = plan.decision
        access.decided(decision)
        turn.explained = explain.decision_headers(decision, None)
        machine = turn.machine = TurnMachine(plan, lookup.session, self.readback is not None,
                                             self.policy.spec.needs.readback)
        try:
            try:
                with guarded(turn.failover.deadline):
                    served = await self._serve(turn, machine)
            except DeadlineExceeded:
                raise BudgetExhausted(over_budget(self.request_timeout)) from None
        except ProxyError as exc:
            exc.headers.update(turn.headers())
            self.metrics.responded(exc.status)
            access.route = turn.route.value if turn.route is not None else None
            raise
        turn.route = served.route  # a readback that fell back is served (and labelled) P->D
        decision = machine.decision(served.route)
        fell_back = explain.fallback(
            decision, served.route,
            None if self.policy.spec.ignores_forcing else incoming.forced)
        access.decided(decision, fell_back)
        turn.explained = explain.decision_headers(decision, fell_back)
        access.route = served.route
        access.prefill = served.prefill.url if served.prefill is not None else None
        access.decode = served.decode.url if served.decode is not None else None
        if not served.rejected:
            self.metrics.routed(incoming.endpoint, served.route, decision, lookup.turn,
                                (fell_back.wanted, fell_back.reason) if fell_back else None)
            if served.route is RouteKind.READBACK:
                self.metrics.read_back(machine.read_back)
            # A stream is open once its first chunk arrived (forward.open_stream): its TTFT.
            ttft = self.clock() - started
            access.ttft_ms = ttft * 1000.0
            self.metrics.first_byte(served.route, ttft, lookup.turn)
        self.metrics.responded(served.result.status)
        return await self._reply(turn, served, lease)

    def _check_model(self, model: Any) -> None:
        known = self.pool.models()
        if known and model is not None and model not in known:
            raise NotFound(f"model {model!r} is not served here (available: {sorted(known)})")

    def _workload(self, incoming: Incoming, transcript: Transcript, lookup: Lookup) -> Workload:
        held = lookup.session.held if lookup.continuation else None
        # Only what is new is counted: D's part comes from the session (vLLM's usage).
        n_in = new_input_tokens(self.counter, incoming.body, held.length if held else 0,
                                chat=incoming.endpoint is Endpoint.CHAT)
        n_out = requested_output_tokens(incoming.body) or round(self.expected_output.value)
        return Workload(lookup.turn, n_in, lookup.cached_tokens, n_out, self.load.rate())

    async def _serve(self, turn: TurnInFlight, machine: TurnMachine) -> Served:
        while (attempt := machine.next_attempt()) is not None:
            served = await self._try(turn, machine, attempt)
            if served is not None:
                return served
        raise AssertionError("a turn plan ends with an attempt that serves or raises")

    async def _try(self, turn: TurnInFlight, machine: TurnMachine,
                   attempt: Attempt) -> Served | None:
        """One attempt of the plan; None when its only node cannot serve (the next one runs)."""
        body, answering = turn.incoming.body, attempt.answering
        if attempt.prefill is not None:  # P->D or readback: P's leg, then D's
            if attempt.route is RouteKind.READBACK and not machine.kept(
                    await self.readback.take(turn.lookup) if self.readback is not None
                    else Reason.READBACK_MISSING):
                return None  # the plan's P->D attempt serves it
            turn.route = attempt.route
            prefill = attempt.prefill
            return await turn.failover.run(answering.role, answering.prefer,
                                           lambda decode: self._pd(turn, decode, prefill),
                                           Served.proves)

        local_body = pd_protocol.local_body(body)
        if machine.keeps(body):  # a local leg: D keeps the blocks for a readback
            local_body = readback.keeping_blocks(local_body)
            turn.token_ids_added = True

        def leg(node: Backend) -> Awaitable[Served]:
            return self._leg(turn, attempt.route, node, local_body, pd_protocol.request_id())

        if answering.only_preferred:  # the session's D, or the D a turn 1 is placed on
            home = turn_machine.take(self.pool, answering)
            if home is None:
                return None
            turn.route = attempt.route
            served = await turn.failover.attempt(home, leg)
            if served is None:
                return None
        else:
            turn.route = attempt.route
            served = await turn.failover.run(answering.role, answering.prefer, leg, Served.proves)
        if not served.rejected and served.decode is not None:
            machine.served(served.decode.url)
        return served

    async def _pd(self, turn: TurnInFlight, decode: Backend, pick: Pick) -> Served:
        """One P->D try on decode: the P leg (failing over among Ps), then D's leg. On a
        readback the first P try reads the kept blocks back from the D that keeps them
        (`TurnMachine.take_held`); any later try (another P, another D) is plain P->D."""
        body, lease = turn.incoming.body, turn.failover.lease
        machine = turn.machine
        assert machine is not None
        route = RouteKind.PD

        async def prefill_on(prefill: Backend) -> tuple[Backend, str, forward.Prefilled | Answer]:
            nonlocal route
            # A fresh id per try: no node ever sees one X-Request-Id twice.
            request_id = pd_protocol.request_id(prefill.zmq_address, decode.zmq_address)
            p_body = pd_protocol.prefill_body(body)
            route = RouteKind.PD
            held = machine.take_held()
            if held is not None:
                params = await readback_legs.prefill_params(
                    self._legs(), machine, prefill.base, turn.incoming.endpoint, body, held,
                    request_id)
                if params is not None:
                    p_body["kv_transfer_params"], route = params, RouteKind.READBACK
            try:
                result: forward.Prefilled | Answer | None = await forward.prefill(
                    self._legs(), prefill.base, turn.incoming.endpoint, p_body, request_id)
            except UpstreamError:
                if route is not RouteKind.READBACK:
                    raise
                result = None
            if result is None or (route is RouteKind.READBACK
                                  and not isinstance(result, forward.Prefilled)):
                # P declined the read (D's blocks gone, a transfer failure): the same P, as
                # plain P->D, like every other fallback - not a 502 on a one-P cluster.
                machine.declined()
                route = RouteKind.PD
                request_id = pd_protocol.request_id(prefill.zmq_address, decode.zmq_address)
                result = await forward.prefill(self._legs(), prefill.base,
                                               turn.incoming.endpoint,
                                               pd_protocol.prefill_body(body), request_id)
            lease.settle(prefill, ok=True)
            return prefill, request_id, result

        prefill, request_id, result = await turn.failover.run(
            pick.role, pick.prefer, prefill_on,
            lambda tried: isinstance(tried[2], forward.Prefilled))
        if isinstance(result, Answer):  # P rejected the request: D is not asked
            return Served(route, result, None, prefill)
        d_body = pd_protocol.decode_body(body, result.kv_transfer_params)
        if machine.keeps(body):
            d_body = readback.with_token_ids(d_body)
            turn.token_ids_added = True
        served = await self._leg(turn, route, decode, d_body, request_id, prefill)
        if not served.rejected:
            machine.served(decode.url, prefill.url)
        return served

    async def _leg(self, turn: TurnInFlight, route: RouteKind, node: Backend, body: dict[str, Any],
                   request_id: str, prefill: Backend | None = None) -> Served:
        """The leg that answers the client, on node: a stream under way, or a whole answer."""
        lease, endpoint = turn.failover.lease, turn.incoming.endpoint
        result: UpstreamStream | Answer
        if turn.incoming.stream:
            result = await forward.open_stream(self._legs(), node.base, endpoint, body,
                                               request_id)
        else:
            result = await forward.complete(self._legs(), node.base, endpoint, body,
                                            request_id)
        if isinstance(result, Answer):
            lease.settle(node, ok=True)
        return Served(route, result, node, prefill)


    def _legs(self) -> Legs:
        if self.legs is None:
            raise RuntimeError("the router has no upstream legs (is the app serving?)")
        return self.legs

    async def _reply(self, turn: TurnInFlight, served: Served, lease: Lease) -> Reply:
        headers = turn.headers()
        if served.decode is not None:
            headers["x-ppd-decode"] = served.decode.url
        if served.prefill is not None:
            headers["x-ppd-prefill"] = served.prefill.url
        result = served.result
        capture = ReplyCapture(turn.incoming.stream)
        if isinstance(result, Answer):
            body = result.body
            if not result.rejected:
                held = None
                if turn.token_ids_added and served.decode is not None:
                    body, held = readback_legs.answer_and_held(
                        body, served.decode.url, self.clock(), self.readback_ttl)
                else:  # D's kv_transfer_params never reach the client
                    body = readback.without_kv_params(body)
                capture.feed(body)
                await self._record(turn, capture.finish(), held)
                self._finished(turn, served.route)
            return Reply(result.status, headers, body, result.content_type)
        assert served.decode is not None  # a stream always comes from the node that answers
        node, relay_lease = served.decode, lease.hand_over()
        in_batch = self.view.streaming(node.url, turn.workload.n_out) if self.view else None

        def on_failure(exc: ProxyError) -> None:
            if isinstance(exc, BudgetExhausted):  # the request's budget ran out, not the node
                turn.access.error = exc.message
                return
            log.warning("upstream %s failed mid-stream: %s", node.url, exc.message)
            self.metrics.upstream_error(node.role.value, "midstream")
            turn.access.error = f"failed mid-stream: {exc.message}"
            charge(self.pool, relay_lease, node, exc)

        async def on_reply(captured: Captured) -> None:
            await self._record(turn, captured)
            if captured.complete:
                self._finished(turn, served.route)

        def on_close() -> None:
            if in_batch is not None and self.view is not None:
                self.view.done(in_batch)
            complete = turn.access.duration_ms is not None  # set by _finished
            turn.access.finish(result.status, self.clock() - turn.started,
                               None if complete else "stream closed before the end (client gone?)")

        headers["cache-control"] = "no-cache"
        relay = Relay(result, node, relay_lease, capture, on_reply, on_failure, on_close,
                      limits=StreamLimits(turn.failover.deadline, over_budget(self.request_timeout),
                                          requested_output_tokens(turn.incoming.body)),
                      record_late=not self.sessions.shared)  # records in this process
        return Reply(result.status, headers, relay, result.content_type)

    def _finished(self, turn: TurnInFlight, route: RouteKind) -> None:
        """A complete reply: its E2E and TPOT go to the metrics and the access line."""
        access = turn.access
        e2e = self.clock() - turn.started
        access.duration_ms = e2e * 1000.0
        ttft = access.ttft_ms / 1000.0 if access.ttft_ms is not None else None
        self.metrics.finished(route, e2e, ttft if turn.incoming.stream else None,
                              access.completion_tokens)

    async def _record(self, turn: TurnInFlight, captured: Captured,
                      kv: HeldKV | None = None) -> None:
        if not captured.complete:
            return  # D holds an unknown part; the session keeps what it knew
        usage = turn_usage(self.counter, captured, turn.workload.n_ctx + turn.workload.n_in)
        self.expected_output.add(usage.completion_tokens)
        turn.access.completion_tokens = usage.completion_tokens
        held = turn.transcript.held_after(captured.text, usage.held_tokens)
        recorded = await self.sessions.record(turn.lookup, held)
        if self.readback is not None and recorded:
            if kv is not None and held is not None:
                await self.readback.put(turn.lookup.session.id, held.digest, kv)
            else:
                await self.readback.discard(turn.lookup.session.id)
