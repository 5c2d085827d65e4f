"""A whole P/D cluster and the proxy in virtual time: events, not sleeps.

Every node is an engine model (`profiler.engine.engine.Engine`) on the same cost preset; the
proxy is `SimProxy` (the proxy's own routing code, its turn plan and turn machine); KV moves
over `profiler.engine.transfer` links, one per P node (its egress port, shared by the
transfers it serves at once), and one per D when D keeps blocks for readbacks. `Simulator`
is the event loop - one heap of events in virtual seconds, ordered by (time, sequence
number) so equal times resolve the same way on every run (`profiler.simulator.sim_events`):

- a turn starts (a conversation arrives, or its previous turn just ended);
- a node's step ends (its tokens exist from then on; the node starts its next step at once
  when it has work, else it idles until a submit, a KV arrival or a KV release wakes it);
- a link's next transfer completes; a request leaves a node's API server for its engine;
- a turn times out, or D's kept blocks outlive their TTL.

Its parts, by job: `profiler.simulator.node_protocol` runs a turn's legs on the nodes
(vLLM's P/D and readback protocol), `profiler.simulator.sim_client` is the replay client
(sending, connections, timeouts, records); this module starts and ends turns through the
proxy and owns the loop and the run's state.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
from collections.abc import Sequence
from typing import Any

from profiler.engine.engine import Engine
from profiler.engine.frontend import ApiServer
from profiler.engine.host import host_of
from profiler.engine.transfer import SharedLink
from profiler.simulator.cluster_state import EngineView
from profiler.simulator.layout import sim_nodes
from profiler.simulator.node_protocol import NodeProtocol, engine_stats, hash_seed, node_config
from profiler.simulator.sim_client import ReplayClient
from profiler.simulator.sim_events import (
    SEND_WAITING,
    STEP_END,
    SUBMIT,
    TOKENIZED,
    TRANSFER,
    TURN,
    UNPIN,
    NodeRun,
    TurnRun,
)
from profiler.simulator.sim_proxy import Plan, SimProxy
from profiler.simulator.sim_setup import DEFAULT_TIMEOUT_S, SimResult, SimSetup
from profiler.simulator.workload import Arrival, SimConversation
from profiler.traces.request_records import RequestRecord
from proxy.shared.vocabulary import Role

# User-message token ids start here: far above any vocabulary, so they never equal a sampled
# output token, and every (conversation, turn) gets its own range (no cross-conversation hits).
_USER_TOKEN_BASE = 1 << 40


class Simulator(ReplayClient, NodeProtocol):
    """One run: a layout, a policy and arrivals, simulated to the last turn's end."""

    def __init__(self, setup: SimSetup) -> None:
        self.setup = setup
        # vLLM's host side beyond the step times (front end per request, KV hand-off)
        self.host = host_of(setup.cost)
        self.now = 0.0
        self._events: list[tuple[float, int, int, Any]] = []
        self._sequence = itertools.count()
        self._nodes: dict[str, NodeRun] = {}
        for spec in sim_nodes(setup.layout):
            config = node_config(setup.engine, spec)
            node = NodeRun(spec, Engine(config, setup.cost), ApiServer.for_host(self.host))
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
                              self.proxy.pool, self._history_of_session,
                              self._prompt_chain_of_session)
            self.proxy.observe_with(view.state if needs.live_view else None,
                                    view.cluster if needs.view else None)
        self._turns: dict[str, TurnRun] = {}  # request id (D's / R's) -> turn
        self._by_prefill: dict[str, TurnRun] = {}  # P's request id -> turn
        self._reading_back: dict[str, TurnRun] = {}  # D->P readback transfer id -> turn
        # With readback on, D keeps each finished turn's blocks (vLLM's bidirectional NIXL):
        # request id -> the D holding them, until P reads them back or the TTL passes; and
        # each conversation's latest such request (the one the proxy's book names).
        self._pinned: dict[str, NodeRun] = {}
        self._latest_pin: dict[str, str] = {}
        self._history: dict[str, list[int]] = {}  # conversation id -> its context's token ids
        # conversation id -> (length, block hashes) of a recorded prompt its history is
        # (sim_client), while the history is still just that prompt
        self._prompt_chains: dict[str, tuple[int, tuple[int, ...]]] = {}
        self._conversation_of: dict[str, str] = {}  # a proxy's own session name -> conversation
        self._records: list[RequestRecord] = []
        # per node, vLLM's request histograms as sums and counts (what its /metrics shows)
        self._metrics: dict[str, dict[str, float]] = {url: {} for url in self._nodes}
        self._next_user_token = _USER_TOKEN_BASE
        self._last_event = 0.0
        self._in_flight = 0  # turns holding one of the client's connections
        self._waiting: list[tuple[float, SimConversation, int]] = []  # due, not yet sent

    def run(self, arrivals: Sequence[Arrival]) -> SimResult:
        for arrival in arrivals:
            self._push(arrival.at, TURN, (arrival.conversation, 0))
        while self._events:
            at, _, kind, payload = heapq.heappop(self._events)
            self.now = at
            if kind == STEP_END:
                self._step_end(*payload)
            elif kind == TRANSFER:
                self._transfer_due(payload)
            elif kind == TURN:
                self._start_turn(*payload)
            elif kind == SUBMIT:
                self._submit(*payload)
            elif kind == SEND_WAITING:
                conversation, index, due = payload
                self._start_turn(conversation, index, due)
            elif kind == UNPIN:
                self._unpin(payload)
            elif kind == TOKENIZED:
                if not payload.done:
                    self._read_back(payload)
            else:
                self._timeout(payload)
        moved = sum(n.link.bytes_moved for n in self._nodes.values() if n.link is not None)
        records = sorted(self._records, key=lambda r: (r.start_s, r.conversation_id, r.turn))
        return SimResult(records, self._last_event, len(arrivals), moved,
                         {url: {**engine_stats(n.engine), **self._metrics[url]}
                          for url, n in self._nodes.items()})

    def _push(self, at: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._events, (at, next(self._sequence), kind, payload))

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

    def _prompt_chain_of_session(self, session_id: str) -> tuple[int, ...] | None:
        """The block hashes of the session's history when it is a recorded prompt whose
        hashes are known (None: the view hashes the history itself)."""
        conversation = self._conversation_of.get(session_id, session_id)
        known, history = self._prompt_chains.get(conversation), self._history.get(conversation)
        if known is None or history is None or len(history) != known[0]:
            return None  # no recorded prompt, or the history grew past it
        return known[1]

    def _finished(self, node: NodeRun, request_id: str) -> None:
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
        # proxy keeps a local turn's too (its leg asks D to: proxy.readback.protocol.KEEP_BLOCKS).
        # (the keep-blocks rule: `proxy.routing.turn_machine.keeps_blocks`)
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
            self._push(end, TURN, (turn.conversation, turn.index + 1))
        else:
            del self._history[turn.conversation.id]
            self._prompt_chains.pop(turn.conversation.id, None)


__all__ = ["DEFAULT_TIMEOUT_S", "SimResult", "SimSetup", "Simulator", "hash_seed"]
