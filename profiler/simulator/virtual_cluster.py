"""A whole P/D cluster and the proxy in virtual time: events, not sleeps.

Every node is an engine model (`profiler.engine.engine.Engine`) on the same cost preset; the
proxy is `SimProxy` (the proxy's own routing code); KV moves over `profiler.engine.transfer`
links, one per P node (its egress port, shared by the transfers it serves at once). Events,
in virtual seconds, ordered by (time, sequence number) so equal times resolve the same way
on every run:

- a turn starts (a conversation arrives, or its previous turn just ended: the replay client
  sends the next turn when the reply is complete, with no think time);
- a node's step ends (its tokens exist from then on; the node starts its next step at once
  when it has work, else it idles until a submit, a KV arrival or a KV release wakes it);
- a link's next transfer completes;
- a turn times out (the replay client's whole-request timeout; the turn fails, its requests
  are aborted on every node, and its conversation ends as in a real replay).

A P->D turn follows vLLM's protocol: P prefills with max_tokens=1 and keeps the KV; then D
is asked, allocates the blocks it does not already cache and pulls the rest over the link;
when the transfer ends D decodes and P frees its blocks. A readback turn (docs/readback.md)
first moves the history's KV that P lacks from the D that keeps it over D's own link (as
many tokens of the new prompt as are the ids D's blocks hold, less P's own prefix-cache
hits), then runs P->D with P computing only the rest (`Request.preloaded`). Not modelled: D
keeping every finished P->D turn's blocks pinned for the TTL (they stay cached here, but
evictable). Records are the replay client's
`RequestRecord`s, so the replay's summaries, files and reports apply unchanged. Inter-token
gaps are not recorded (itl_s is empty): TTFT and TPOT come from the first and last token.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from profiler.engine.config import EngineConfig
from profiler.engine.cost import CostModel
from profiler.engine.engine import Engine, StepResult
from profiler.engine.frontend import ApiServer
from profiler.engine.host import host_of
from profiler.engine.prefix_cache import block_hashes
from profiler.engine.requests import Request, RequestRejected
from profiler.engine.transfer import Link, SharedLink
from profiler.simulator.cluster_state import EngineView
from profiler.simulator.layout import SimNode, sim_nodes
from profiler.simulator.sim_proxy import Plan, SimProxy
from profiler.simulator.workload import Arrival, SimConversation
from profiler.traces.request_records import RequestRecord
from proxy.load_meter import DEFAULT_LOAD_WINDOW_S
from proxy.policies.routing import RoutingPolicy
from proxy.readback import VLLM_DECODER_BLOCKS_TTL_S
from proxy.vocabulary import Layout, Role, RouteKind

# User-message token ids start here: far above any vocabulary, so they never equal a sampled
# output token, and every (conversation, turn) gets its own range (no cross-conversation hits).
_USER_TOKEN_BASE = 1 << 40
DEFAULT_TIMEOUT_S = 30.0

# Event kinds, in the order ties at one instant are handled.
_STEP_END, _TRANSFER, _TURN, _TIMEOUT, _SUBMIT, _SEND_WAITING, _UNPIN, _TOKENIZED = range(8)


@dataclass(frozen=True, slots=True)
class SimSetup:
    """Everything a run needs besides its workload."""

    layout: Layout
    cost: CostModel
    policy: RoutingPolicy
    link: Link
    kv_bytes_per_token: int
    engine: EngineConfig = field(default_factory=EngineConfig)
    timeout_s: float = DEFAULT_TIMEOUT_S
    load_window_s: float = DEFAULT_LOAD_WINDOW_S
    forced: Callable[[int], RouteKind | None] | None = None
    # The paper's benchmark client (scripts/benchmark/comprehensive_benchmark.py in its
    # repository): at most this many requests in flight; a turn due while every connection
    # is busy waits for one, and its TTFT clock runs from when it was due. None: the ideal
    # client (every turn is sent when it is due), as `ppd replay`.
    client_connections: int | None = None
    # The next turn carries each reply as text that the server tokenizes again into other
    # ids, so it misses the prefix cache past the previous prompt (the tiny CPU model's
    # replies never round-trip: docs/engine-model.md). False: the reply's own token ids come
    # back (a model whose text re-tokenizes to what it generated; the paper's assumption).
    reply_retokenized: bool = False
    # D keeps a finished P->D turn's blocks for a readback this long (vLLM's
    # decoder_kv_blocks_ttl, as `ppd cluster up` sets it); None: no readback route.
    readback_ttl_s: float | None = VLLM_DECODER_BLOCKS_TTL_S
    # The paper's client sends the reply back as text: of a reply of n tokens, the first
    # kept_reply(n) keep their ids (and hit), the rest come back as new ids
    # (`paper_client.kept_reply_tokens`). None: as reply_retokenized says.
    kept_reply: Callable[[int], int] | None = None
    # The paper's proxy places a new conversation on node `hash(conversation) % n` of each
    # role and keeps it there (`sim_proxy.hashed_placement`); this seeds that hash (Python's
    # str hash is drawn per proxy process). None: ppd's pool, the least loaded node.
    placement_seed: int | None = None
    # The conversation and turn the proxy sees for a client's (conversation, turn): the
    # paper's proxy names a conversation by its prompt's text, and some turn 2s are a new
    # conversation to it (`paper_client.proxy_conversation`). None: the client's own.
    proxy_names: Callable[[str, int], tuple[str, int]] | None = None


@dataclass(slots=True)
class SimResult:
    """What a run produced: the records, its virtual length, and cluster-side counters."""

    records: list[RequestRecord]
    wall_time_s: float  # virtual seconds from the first arrival window's start to the last end
    n_conversations: int
    kv_bytes_moved: float
    node_stats: dict[str, Any]


@dataclass(slots=True)
class _Node:
    spec: SimNode
    engine: Engine
    api: ApiServer  # its API server, a FIFO queue (profiler/engine/frontend.py)
    busy: bool = False  # a step is running (its end event is queued)
    link: SharedLink | None = None  # P (and D, for readbacks): the egress port transfers share
    link_event: float | None = None  # the queued completion time of link (None: none queued)


@dataclass(slots=True)
class _Turn:
    """One turn in flight."""

    conversation: SimConversation
    index: int  # 0-based turn index in the conversation
    request_id: str
    start: float
    prompt: list[int]
    plan: Plan
    done: bool = False
    prefill_id: str | None = None
    preloaded: int = 0  # a readback: prompt tokens P reads from D instead of computing


class Simulator:
    """One run: a layout, a policy and arrivals, simulated to the last turn's end."""

    def __init__(self, setup: SimSetup) -> None:
        self.setup = setup
        # vLLM's host side beyond the step times (front end per request, KV hand-off)
        self.host = host_of(setup.cost)
        self.now = 0.0
        self._events: list[tuple[float, int, int, Any]] = []
        self._sequence = itertools.count()
        self._nodes: dict[str, _Node] = {}
        for spec in sim_nodes(setup.layout):
            config = _node_config(setup.engine, spec)
            node = _Node(spec, Engine(config, setup.cost), ApiServer.for_host(self.host))
            if spec.role is Role.PREFILL or (spec.role is Role.DECODE
                                             and setup.readback_ttl_s is not None):
                node.link = SharedLink(setup.link)
            self._nodes[spec.url] = node
        self.proxy = SimProxy([n.spec for n in self._nodes.values()],
                              setup.policy, lambda: self.now,
                              load_window_s=setup.load_window_s, forced=setup.forced,
                              readback_ttl_s=setup.readback_ttl_s,
                              placement_seed=setup.placement_seed)
        needs = setup.policy.spec.needs
        if needs.live_view or needs.view:
            view = EngineView({url: n.engine for url, n in self._nodes.items()},
                              self.proxy.pool, self._history_of_session)
            self.proxy.observe_with(view.state if needs.live_view else None,
                                    view.cluster if needs.view else None)
        self._turns: dict[str, _Turn] = {}  # request id (D's / R's) -> turn
        self._by_prefill: dict[str, _Turn] = {}  # P's request id -> turn
        self._reading_back: dict[str, _Turn] = {}  # D->P readback transfer id -> turn
        # With readback on, D keeps each finished turn's blocks (vLLM's bidirectional NIXL):
        # request id -> the D holding them, until P reads them back or the TTL passes; and
        # each conversation's latest such request (the one the proxy's book names).
        self._pinned: dict[str, _Node] = {}
        self._latest_pin: dict[str, str] = {}
        self._history: dict[str, list[int]] = {}  # conversation id -> its context's token ids
        self._conversation_of: dict[str, str] = {}  # a proxy's own session name -> conversation
        self._records: list[RequestRecord] = []
        # per node, vLLM's request histograms as sums and counts (what its /metrics shows)
        self._metrics: dict[str, dict[str, float]] = {url: {} for url in self._nodes}
        self._next_user_token = _USER_TOKEN_BASE
        self._last_event = 0.0
        self._in_flight = 0  # turns holding one of the client's connections
        self._waiting: list[tuple[float, SimConversation, int]] = []  # due, not yet sent

    # -- the loop ------------------------------------------------------------------------------

    def run(self, arrivals: Sequence[Arrival]) -> SimResult:
        for arrival in arrivals:
            self._push(arrival.at, _TURN, (arrival.conversation, 0))
        while self._events:
            at, _, kind, payload = heapq.heappop(self._events)
            self.now = at
            if kind == _STEP_END:
                self._step_end(*payload)
            elif kind == _TRANSFER:
                self._transfer_due(payload)
            elif kind == _TURN:
                self._start_turn(*payload)
            elif kind == _SUBMIT:
                self._submit(*payload)
            elif kind == _SEND_WAITING:
                conversation, index, due = payload
                self._start_turn(conversation, index, due)
            elif kind == _UNPIN:
                self._unpin(payload)
            elif kind == _TOKENIZED:
                if not payload.done:
                    self._read_back(payload)
            else:
                self._timeout(payload)
        moved = sum(n.link.bytes_moved for n in self._nodes.values() if n.link is not None)
        records = sorted(self._records, key=lambda r: (r.start_s, r.conversation_id, r.turn))
        return SimResult(records, self._last_event, len(arrivals), moved,
                         {url: {**_stats(n.engine), **self._metrics[url]}
                          for url, n in self._nodes.items()})

    def _push(self, at: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._events, (at, next(self._sequence), kind, payload))

    # -- turns ---------------------------------------------------------------------------------

    def _start_turn(self, conversation: SimConversation, index: int,
                    due: float | None = None) -> None:
        cap = self.setup.client_connections
        if due is not None and self.now >= due + self.setup.timeout_s:
            # Timed out waiting for a connection: never sent (the capped client's timeout
            # runs from when the turn was due, as aiohttp's `total` covers the pool's wait).
            self._record_unsent(conversation, index, due)
            if self._waiting:  # the connection it would have taken goes to the next turn
                self._release_connection(self.now, taken=False)
            return
        if cap is not None and self._in_flight >= cap:
            self._waiting.append((self.now, conversation, index))
            return
        self._in_flight += 1
        turn_spec = conversation.turns[index]
        history = self._history.setdefault(conversation.id, [])
        n_new = turn_spec.n_user + (conversation.n_system if index == 0 else 0)
        if turn_spec.prompt is not None:  # a recorded trace's request (workload.TimedWorkload):
            prompt = turn_spec.prompt.ids()  # its own prompt, which the live view reads as
            history[:] = prompt  # its history (what a node may hold of it)
        else:
            prompt = history + self._fresh_tokens(n_new)
        plan = self._route(conversation, index, n_new, len(prompt))
        request_id = f"{conversation.id}/{index + 1}"
        start = self.now if due is None else due  # the capped client's clock starts when due
        turn = _Turn(conversation, index, request_id, start, prompt, plan)
        self._turns[request_id] = turn
        # The timeout runs from the turn's start: when it was due, for a capped client (it
        # counts the wait for a connection), else when it is sent.
        self._push(start + self.setup.timeout_s, _TIMEOUT, request_id)
        if plan.route is RouteKind.READBACK:
            self._tokenize_at_prefill(turn)
        elif plan.route is RouteKind.PD:
            self._submit_prefill(turn)
        else:
            self._submit_via_frontend(turn, plan.decode.url,
                         Request(request_id, max_tokens=turn_spec.max_tokens,
                                 prompt_token_ids=prompt, keep_kv=plan.machine.keeps()))

    def _route(self, conversation: SimConversation, index: int, n_new: int,
               n_prompt: int) -> Plan:
        """The proxy's plan for a turn, under the name the proxy gives its conversation."""
        max_tokens = conversation.turns[index].max_tokens
        if self.setup.proxy_names is None:
            return self.proxy.begin(conversation.id, index + 1, n_new, max_tokens)
        session, turn = self.setup.proxy_names(conversation.id, index + 1)
        if session != conversation.id:
            self._conversation_of[session] = conversation.id
        # a turn the proxy takes for a new conversation's first brings it the whole prompt
        seen_new = n_prompt if turn == 1 and index > 0 else n_new
        return self.proxy.begin(session, turn, seen_new, max_tokens)

    def _history_of_session(self, session_id: str) -> list[int] | None:
        return self._history.get(self._conversation_of.get(session_id, session_id))

    def _submit_prefill(self, turn: _Turn) -> None:
        """P->D's P leg (a readback's too, with the tokens P read back)."""
        plan = turn.plan
        assert plan.prefill is not None
        turn.prefill_id = f"{turn.request_id}/p"
        self._by_prefill[turn.prefill_id] = turn
        self._submit_via_frontend(turn, plan.prefill.url,
                                  Request(turn.prefill_id, max_tokens=1,
                                          prompt_token_ids=turn.prompt, send_kv=True,
                                          preloaded=turn.preloaded))

    def _tokenize_at_prefill(self, turn: _Turn) -> None:
        """A readback first asks P's API server to tokenize the new prompt (the proxy's
        `/tokenize` round trip, proxy.readback): one pass through its front end, queued
        behind the requests that reached it first; then the read."""
        assert turn.plan.prefill is not None
        prefill = self._nodes[turn.plan.prefill.url]
        done = prefill.api.admit(self.now, len(turn.prompt), prefill.engine.num_running())
        self._push(done, _TOKENIZED, turn)

    def _read_back(self, turn: _Turn) -> None:
        """A readback: the tokens of the new prompt that D's blocks hold (their common
        prefix, as the proxy computes it) move D->P over D's link - all but P's own
        prefix-cache hits - then P's leg computes the rest. Too few: P->D."""
        plan = turn.plan
        assert plan.held is not None and plan.prefill is not None
        matched = plan.machine.tokenized(plan.held, turn.prompt)
        if matched is None:  # too few match: the turn runs P->D (reason readback_mismatch)
            plan.held = None
            self._submit_prefill(turn)
            return
        turn.preloaded = matched
        prefill = self._nodes[plan.prefill.url]
        size = prefill.engine.config.block_size
        cached = prefill.engine.cached_prefix_tokens(block_hashes(turn.prompt[:matched], size))
        source = self._nodes[plan.held.decode]
        tokens = matched - min(cached, matched)
        if tokens <= 0 or source.link is None:
            self._submit_prefill(turn)
            return
        transfer_id = f"{turn.request_id}/rb"
        self._reading_back[transfer_id] = turn
        source.link.start(transfer_id, tokens * self.setup.kv_bytes_per_token, self.now,
                          setup_s=self.host.handoff_s(tokens, self.setup.engine.block_size))
        self._schedule_link(source)

    def _submit_via_frontend(self, turn: _Turn, url: str, request: Request) -> None:
        """The node's API server takes its front-end time before its engine sees the
        request (HTTP, template, tokenize; the first output's way back is counted here),
        after the requests that reached it first (a FIFO queue: frontend.ApiServer)."""
        tokens = (len(request.prompt_token_ids) if request.prompt_token_ids is not None
                  else request.prompt_len or 0)
        node = self._nodes[url]
        delay = node.api.admit(self.now, tokens, node.engine.num_running()) - self.now
        if delay > 0:
            self._push(self.now + delay, _SUBMIT, (turn, url, request))
        else:
            self._submit(turn, url, request)

    def _submit(self, turn: _Turn, url: str, request: Request) -> None:
        if turn.done:
            return  # timed out while its request was in the front end
        node = self._nodes[url]
        try:
            node.engine.submit(request, self.now)
        except RequestRejected as exc:  # vLLM answers 400 before scheduling
            self._fail(turn, str(exc), status=400)
            return
        self._wake(node)

    def _prefill_done(self, turn: _Turn) -> None:
        """P answered: the proxy frees P's slot and asks D, which will pull the KV."""
        plan = turn.plan
        self.proxy.prefilled(plan)
        assert plan.prefill is not None
        self._submit_via_frontend(
            turn, plan.decode.url,
            Request(turn.request_id, max_tokens=turn.conversation.turns[turn.index].max_tokens,
                    prompt_token_ids=turn.prompt, kv_from=plan.prefill.url,
                    keep_kv=plan.machine.keeps()))

    def _pin(self, node: _Node, turn: _Turn) -> None:
        """D holds the finished turn's blocks (no eviction) until read back or the TTL."""
        assert self.setup.readback_ttl_s is not None
        self._pinned[turn.request_id] = node
        self._latest_pin[turn.conversation.id] = turn.request_id
        self._push(self.now + self.setup.readback_ttl_s, _UNPIN, turn.request_id)

    def _unpin(self, request_id: str) -> None:
        node = self._pinned.pop(request_id, None)
        if node is None:
            return  # read back already
        node.engine.release_kv(request_id)
        node.engine.forget(request_id)
        self._wake(node)

    def _finished(self, node: _Node, request_id: str) -> None:
        turn = self._turns.pop(request_id, None)
        if turn is None or turn.done:
            # The turn timed out while this request's last step ran (the engine settles a
            # step when it starts): _timeout already aborted and forgot it here.
            with contextlib.suppress(KeyError):
                node.engine.forget(request_id)
            return
        seq = node.engine.sequence(request_id)
        if seq.request.keep_kv:
            self._pin(node, turn)  # forgotten when D frees the blocks
        else:
            node.engine.forget(request_id)
        turn.done = True
        outputs = seq.output_token_ids
        first = seq.first_token_time if seq.first_token_time is not None else self.now
        end = self.now + self.host.frontend_finish_ms / 1000
        self._record(turn, success=True, ttft=first - turn.start, end=end,
                     n_output=len(outputs), error=None, status=200)
        # D keeps the KV of the prompt and all but the last output (never computed); the
        # proxy keeps a local turn's too (its leg asks D to: proxy.readback.KEEP_BLOCKS).
        # (the keep-blocks rule: `proxy.turn_machine.keeps_blocks`)
        kept = turn.prompt + outputs[:-1] if turn.plan.machine.keeps() else None
        self.proxy.end(turn.plan, True, len(turn.prompt), len(outputs), kept)
        history = self._history[turn.conversation.id]
        history[len(history):] = turn.prompt[len(history):]
        if self.setup.kept_reply is not None:
            same_ids = min(len(outputs), self.setup.kept_reply(len(outputs)))
            history.extend(outputs[:same_ids])
            history.extend(self._fresh_tokens(len(outputs) - same_ids))
        elif self.setup.reply_retokenized:
            history.extend(self._fresh_tokens(len(outputs)))
        else:
            history.extend(outputs)
        if turn.index + 1 < len(turn.conversation.turns):
            self._push(end, _TURN, (turn.conversation, turn.index + 1))
        else:
            del self._history[turn.conversation.id]

    def _fresh_tokens(self, count: int) -> list[int]:
        """Token ids no other prompt or reply holds (a user message, a re-tokenized reply)."""
        first = self._next_user_token
        self._next_user_token += count
        return list(range(first, first + count))

    def _fail(self, turn: _Turn, error: str, status: int | None) -> None:
        if turn.done:
            return
        turn.done = True
        self._turns.pop(turn.request_id, None)
        self._record(turn, success=False, ttft=None, end=self.now, n_output=0, error=error,
                     status=status)
        self.proxy.end(turn.plan, False, 0, 0)
        self._history.pop(turn.conversation.id, None)  # a failed turn ends its conversation

    def _timeout(self, request_id: str) -> None:
        turn = self._turns.get(request_id)
        if turn is None or turn.done:
            return
        plan = turn.plan
        if turn.prefill_id is not None and plan.prefill is not None:
            self._abort(plan.prefill.url, turn.prefill_id)
            self._by_prefill.pop(turn.prefill_id, None)
        self._abort(plan.decode.url, request_id)
        self._fail(turn, f"timeout after {self.setup.timeout_s:g} s", status=200)

    def _abort(self, url: str, request_id: str) -> None:
        node = self._nodes[url]
        try:
            node.engine.abort(request_id, self.now, "timeout")
            node.engine.forget(request_id)
        except (KeyError, ValueError):
            return  # never submitted there (P had not answered yet), or already gone
        self._wake(node)

    def _record(self, turn: _Turn, *, success: bool, ttft: float | None, end: float,
                n_output: int, error: str | None, status: int | None) -> None:
        e2e = end - turn.start
        tpot = (e2e - ttft) / (n_output - 1) if success and ttft is not None and n_output > 1 \
            else None
        plan = turn.plan
        self._records.append(RequestRecord(
            conversation_id=turn.conversation.id, turn=turn.index + 1, route=plan.route.value,
            decode=plan.decode.url, prefill=plan.prefill.url if plan.prefill else None,
            start_s=turn.start, ttft_s=ttft, tpot_s=tpot, e2e_s=e2e, itl_s=(),
            n_input_tokens=len(turn.prompt), n_output_tokens=n_output, success=success,
            error=error, status=status, max_tokens=turn.conversation.turns[turn.index].max_tokens,
            proxy_turn=plan.lookup.turn))
        self._last_event = max(self._last_event, end)
        self._release_connection(end)

    def _record_unsent(self, conversation: SimConversation, index: int, due: float) -> None:
        """A turn whose timeout passed while it waited for a connection: a failure at its
        deadline, and the end of its conversation (as any failed turn)."""
        end = due + self.setup.timeout_s
        turn_spec = conversation.turns[index]
        self._records.append(RequestRecord(
            conversation_id=conversation.id, turn=index + 1, route=None, decode=None,
            prefill=None, start_s=due, ttft_s=None, tpot_s=None, e2e_s=end - due, itl_s=(),
            n_input_tokens=None, n_output_tokens=0, success=False,
            error=f"timeout after {self.setup.timeout_s:g} s waiting for a connection",
            status=None, max_tokens=turn_spec.max_tokens, proxy_turn=None))
        self._last_event = max(self._last_event, end)
        self._history.pop(conversation.id, None)

    def _release_connection(self, at: float, taken: bool = True) -> None:
        """The turn's connection is free (`taken`: a turn held it): the longest-waiting due
        turn takes it."""
        if taken:
            self._in_flight -= 1
        if self._waiting:
            due, conversation, index = self._waiting.pop(0)
            self._push(at, _SEND_WAITING, (conversation, index, due))

    # -- nodes ---------------------------------------------------------------------------------

    def _wake(self, node: _Node) -> None:
        """Start node's next step now if it is idle and has work."""
        if node.busy:
            return
        start = node.engine.next_step_time()
        if start is None:
            return
        result = node.engine.step(max(start, self.now))
        node.busy = True
        self._push(result.end, _STEP_END, (node, result))

    def _step_end(self, node: _Node, result: StepResult) -> None:
        node.busy = False
        for request_id, tokens in result.kv_pulls:
            turn = self._turns.get(request_id)
            if turn is None or turn.plan.prefill is None:
                continue
            self._start_transfer(turn, tokens)
        for request_id in result.finished:
            prefill_turn = self._by_prefill.pop(request_id, None)
            self._count_request(node, request_id)
            if prefill_turn is not None:
                if not prefill_turn.done:
                    self._prefill_done(prefill_turn)
                continue
            self._finished(node, request_id)
        self._wake(node)

    def _count_request(self, node: _Node, request_id: str) -> None:
        """Add a finished request to its node's vLLM-style histograms (sums and counts):
        TTFT from the API server's arrival (front end included), queue and prefill time
        from the engine's scheduling, inter-token latency over its decode."""
        try:
            seq = node.engine.sequence(request_id)
        except KeyError:
            return
        if seq.first_token_time is None or seq.scheduled_time is None \
                or seq.finish_time is None:
            return
        frontend = self.host.frontend_s(seq.num_prompt)
        n_out = len(seq.output_token_ids)
        metrics = self._metrics[node.spec.url]
        for name, value in (
                ("time_to_first_token_seconds_sum", seq.first_token_time - seq.arrival + frontend),
                ("request_queue_time_seconds_sum", seq.scheduled_time - seq.arrival),
                ("request_prefill_time_seconds_sum", seq.first_token_time - seq.scheduled_time),
                ("inter_token_latency_seconds_sum", seq.finish_time - seq.first_token_time),
                ("inter_token_latency_seconds_count", n_out - 1),
                ("requests", 1), ("prompt_tokens", seq.num_prompt),
                ("generation_tokens", n_out)):
            metrics[name] = metrics.get(name, 0.0) + value

    # -- KV transfers --------------------------------------------------------------------------

    def _start_transfer(self, turn: _Turn, tokens: int) -> None:
        assert turn.plan.prefill is not None
        source = self._nodes[turn.plan.prefill.url]
        assert source.link is not None
        setup_s = self.host.handoff_s(tokens, self.setup.engine.block_size)
        source.link.start(turn.request_id, tokens * self.setup.kv_bytes_per_token, self.now,
                          setup_s=setup_s)
        self._schedule_link(source)

    def _schedule_link(self, source: _Node) -> None:
        assert source.link is not None
        due = source.link.next_completion()
        if due is not None and due != source.link_event:
            source.link_event = due
            self._push(due, _TRANSFER, source)

    def _transfer_due(self, source: _Node) -> None:
        assert source.link is not None
        if source.link_event != self.now:
            return  # superseded: a transfer started since moved the completion
        source.link_event = None
        for request_id in source.link.advance(self.now):
            read_back = self._reading_back.pop(request_id, None)
            if read_back is not None:  # D's blocks are in P: P's leg computes the rest
                # P tells D it has read them: D frees the blocks it kept (vLLM's NIXL
                # notification), before its TTL.
                pinned = self._latest_pin.pop(read_back.conversation.id, None)
                if pinned is not None:
                    self._unpin(pinned)
                if not read_back.done:
                    self._submit_prefill(read_back)
                continue
            turn = self._turns.get(request_id)
            if turn is None or turn.done:
                continue
            decode = self._nodes[turn.plan.decode.url]
            decode.engine.kv_arrived(request_id)
            assert turn.prefill_id is not None
            source.engine.release_kv(turn.prefill_id)
            source.engine.forget(turn.prefill_id)
            self._wake(decode)
            self._wake(source)
        self._schedule_link(source)


def _node_config(base: EngineConfig, spec: SimNode) -> EngineConfig:
    return replace(base, role=spec.role, seed=hash_seed(base.seed, spec.name))


def hash_seed(seed: int, name: str) -> int:
    """A per-node seed that is stable across runs (unlike hash() of a str)."""
    return seed * 1_000_003 + sum((i + 1) * ord(ch) for i, ch in enumerate(name))


def _stats(engine: Engine) -> dict[str, Any]:
    stats = engine.stats()
    return {"prefix_cache_queries": stats.prefix_cache_queries,
            "prefix_cache_hits": stats.prefix_cache_hits,
            "external_prefix_cache_hits": stats.external_prefix_cache_hits,
            "num_preemptions": stats.num_preemptions,
            "num_evictions": stats.num_evictions}
