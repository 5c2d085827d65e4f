"""The replay client of a simulated run: when each turn is sent, its connections and
timeouts, and the records it keeps (the replay's `RequestRecord`s, so `ppd replay`'s
summaries, files and reports apply unchanged).

The client sends a conversation's next turn when the reply is complete, with no think time;
with a connection cap (the PPD paper's client) a turn due while every connection is busy
waits for one, and its timeout runs from when it was due. A turn that times out fails; its
requests are aborted on every node and its conversation ends, as in a real replay.
Inter-token gaps are not recorded (itl_s is empty): TTFT and TPOT come from the first and last
token. `ReplayClient` is a part of `profiler.simulator.virtual_cluster.Simulator`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from profiler.engine.requests import Request
from profiler.simulator.sim_events import SEND_WAITING, TIMEOUT, TurnRun
from profiler.simulator.workload import SimConversation
from profiler.traces.request_records import RequestRecord
from proxy.routing.turn_machine import Leg

if TYPE_CHECKING:
    from profiler.simulator.sim_setup import SimSetup


class ReplayClient:
    """The client side of a simulated run (see the module docstring)."""

    setup: SimSetup
    now: float
    _turns: dict[str, TurnRun]
    _history: dict[str, list[int]]
    _prompt_chains: dict[str, tuple[int, tuple[int, ...]]]
    _records: list[RequestRecord]
    _next_user_token: int
    _last_event: float
    _in_flight: int
    _waiting: list[tuple[float, SimConversation, int]]
    # Also uses the event loop's `_push` and the proxy's plan, `_route`
    # (virtual_cluster.Simulator), and the legs of `node_protocol.NodeProtocol`.

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
        hashes = None
        if turn_spec.prompt is not None:  # a recorded trace's request (workload.TimedWorkload):
            prompt = turn_spec.prompt.ids()  # its own prompt, which the live view reads as
            history[:] = prompt  # its history (what a node may hold of it)
            hashes = turn_spec.prompt.hashes(self.setup.engine.block_size)
            self._prompt_chains[conversation.id] = (len(prompt), hashes)
        else:
            prompt = history + self._fresh_tokens(n_new)
        plan = self._route(conversation, index, n_new, len(prompt))
        request_id = f"{conversation.id}/{index + 1}"
        start = self.now if due is None else due  # the capped client's clock starts when due
        turn = TurnRun(conversation, index, request_id, start, prompt, plan,
                       prompt_hashes=hashes)
        self._turns[request_id] = turn
        # The timeout runs from the turn's start: when it was due, for a capped client (it
        # counts the wait for a connection), else when it is sent.
        self._push(start + self.setup.timeout_s, TIMEOUT, request_id)
        first = plan.machine.legs()[0]  # the turn machine's legs, in order
        if first is Leg.TOKENIZE:
            self._tokenize_at_prefill(turn)
        elif first is Leg.PREFILL:
            self._submit_prefill(turn)
        else:
            self._submit_via_frontend(turn, plan.decode.url,
                         Request(request_id, max_tokens=turn_spec.max_tokens,
                                 prompt_token_ids=prompt, keep_kv=plan.machine.pins(),
                                 prompt_hashes=hashes))

    def _fresh_tokens(self, count: int) -> list[int]:
        """Token ids no other prompt or reply holds (a user message, a re-tokenized reply)."""
        first = self._next_user_token
        self._next_user_token += count
        return list(range(first, first + count))

    def _fail(self, turn: TurnRun, error: str, status: int | None) -> None:
        if turn.done:
            return
        turn.done = True
        self._turns.pop(turn.request_id, None)
        self._record(turn, success=False, ttft=None, end=self.now, n_output=0, error=error,
                     status=status)
        self.proxy.end(turn.plan, False, 0, 0)
        self._history.pop(turn.conversation.id, None)  # a failed turn ends its conversation
        self._prompt_chains.pop(turn.conversation.id, None)

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

    def _record(self, turn: TurnRun, *, success: bool, ttft: float | None, end: float,
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
        self._prompt_chains.pop(conversation.id, None)

    def _release_connection(self, at: float, taken: bool = True) -> None:
        """The turn's connection is free (`taken`: a turn held it): the longest-waiting due
        turn takes it."""
        if taken:
            self._in_flight -= 1
        if self._waiting:
            due, conversation, index = self._waiting.pop(0)
            self._push(at, SEND_WAITING, (conversation, index, due))
