"""How a turn's legs run on the simulated nodes: vLLM's P/D and readback protocol over
engine models, in virtual time.

Each leg passes a node's API server (a FIFO front end) before its engine sees it. A P->D
turn follows vLLM's protocol: P prefills with max_tokens=1 and keeps the KV; then D is
asked, allocates the blocks it does not already cache and pulls the rest over P's link;
when the transfer ends D decodes and P frees its blocks. A readback turn first asks P to
tokenize the new prompt, then moves the history's KV that P lacks from the D that keeps it
over D's own link (as many tokens of the new prompt as the ids D's blocks hold - the turn
machine's rule, `proxy.routing.turn_machine` - less P's own prefix-cache hits), then runs P->D with
P computing only the rest (`Request.preloaded`). D keeps a finished turn's blocks pinned
until P reads them or the TTL passes. `NodeProtocol` is a part of
`profiler.simulator.virtual_cluster.Simulator`: it reads the run's state the simulator owns.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from profiler.engine.config import EngineConfig
from profiler.engine.engine import Engine, StepResult
from profiler.engine.prefix_cache import block_hashes
from profiler.engine.requests import Request, RequestRejected
from profiler.simulator.layout import SimNode
from profiler.simulator.sim_events import (
    STEP_END,
    SUBMIT,
    TOKENIZED,
    TRANSFER,
    UNPIN,
    NodeRun,
    TurnRun,
)

if TYPE_CHECKING:
    from profiler.engine.host import HostModel
    from profiler.simulator.sim_proxy import SimProxy
    from profiler.simulator.sim_setup import SimSetup


class NodeProtocol:
    """The node side of a simulated run (see the module docstring)."""

    setup: SimSetup
    host: HostModel
    now: float
    proxy: SimProxy
    _nodes: dict[str, NodeRun]
    _turns: dict[str, TurnRun]
    _by_prefill: dict[str, TurnRun]
    _reading_back: dict[str, TurnRun]
    _pinned: dict[str, NodeRun]
    _latest_pin: dict[str, str]
    _metrics: dict[str, dict[str, float]]
    # Also uses the event loop's `_push` and the turn's end, `_finished`
    # (virtual_cluster.Simulator), and the client's `_fail` (sim_client.ReplayClient).

    def _submit_prefill(self, turn: TurnRun) -> None:
        """P->D's P leg (a readback's too, with the tokens P read back)."""
        plan = turn.plan
        assert plan.prefill is not None
        turn.prefill_id = f"{turn.request_id}/p"
        self._by_prefill[turn.prefill_id] = turn
        self._submit_via_frontend(turn, plan.prefill.url,
                                  Request(turn.prefill_id, max_tokens=1,
                                          prompt_token_ids=turn.prompt, send_kv=True,
                                          preloaded=turn.preloaded,
                                          prompt_hashes=turn.prompt_hashes))

    def _tokenize_at_prefill(self, turn: TurnRun) -> None:
        """A readback first asks P's API server to tokenize the new prompt (the proxy's
        `/tokenize` round trip, proxy.readback.protocol): one pass through its front end, queued
        behind the requests that reached it first; then the read."""
        assert turn.plan.prefill is not None
        prefill = self._nodes[turn.plan.prefill.url]
        done = prefill.api.admit(self.now, len(turn.prompt), prefill.engine.num_running())
        self._push(done, TOKENIZED, turn)

    def _read_back(self, turn: TurnRun) -> None:
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

    def _submit_via_frontend(self, turn: TurnRun, url: str, request: Request) -> None:
        """The node's API server takes its front-end time before its engine sees the
        request (HTTP, template, tokenize; the first output's way back is counted here),
        after the requests that reached it first (a FIFO queue: frontend.ApiServer)."""
        tokens = (len(request.prompt_token_ids) if request.prompt_token_ids is not None
                  else request.prompt_len or 0)
        node = self._nodes[url]
        delay = node.api.admit(self.now, tokens, node.engine.num_running()) - self.now
        if delay > 0:
            self._push(self.now + delay, SUBMIT, (turn, url, request))
        else:
            self._submit(turn, url, request)

    def _submit(self, turn: TurnRun, url: str, request: Request) -> None:
        if turn.done:
            return  # timed out while its request was in the front end
        node = self._nodes[url]
        try:
            node.engine.submit(request, self.now)
        except RequestRejected as exc:  # vLLM answers 400 before scheduling
            self._fail(turn, str(exc), status=400)
            return
        self._wake(node)

    def _prefill_done(self, turn: TurnRun) -> None:
        """P answered: the proxy frees P's slot and asks D, which will pull the KV."""
        plan = turn.plan
        self.proxy.prefilled(plan)
        assert plan.prefill is not None
        self._submit_via_frontend(
            turn, plan.decode.url,
            Request(turn.request_id, max_tokens=turn.conversation.turns[turn.index].max_tokens,
                    prompt_token_ids=turn.prompt, kv_from=plan.prefill.url,
                    keep_kv=plan.machine.pins(), prompt_hashes=turn.prompt_hashes))

    def _pin(self, node: NodeRun, turn: TurnRun) -> None:
        """D holds the finished turn's blocks (no eviction) until read back or the TTL."""
        assert self.setup.readback_ttl_s is not None
        self._pinned[turn.request_id] = node
        self._latest_pin[turn.conversation.id] = turn.request_id
        self._push(self.now + self.setup.readback_ttl_s, UNPIN, turn.request_id)

    def _unpin(self, request_id: str) -> None:
        node = self._pinned.pop(request_id, None)
        if node is None:
            return  # read back already
        node.engine.release_kv(request_id)
        node.engine.forget(request_id)
        self._wake(node)

    def _abort(self, url: str, request_id: str) -> None:
        node = self._nodes[url]
        try:
            node.engine.abort(request_id, self.now, "timeout")
            node.engine.forget(request_id)
        except (KeyError, ValueError):
            return  # never submitted there (P had not answered yet), or already gone
        self._wake(node)

    def _wake(self, node: NodeRun) -> None:
        """Start node's next step now if it is idle and has work."""
        if node.busy:
            return
        start = node.engine.next_step_time()
        if start is None:
            return
        result = node.engine.step(max(start, self.now))
        node.busy = True
        self._push(result.end, STEP_END, (node, result))

    def _step_end(self, node: NodeRun, result: StepResult) -> None:
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

    def _count_request(self, node: NodeRun, request_id: str) -> None:
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

    def _start_transfer(self, turn: TurnRun, tokens: int) -> None:
        assert turn.plan.prefill is not None
        source = self._nodes[turn.plan.prefill.url]
        assert source.link is not None
        setup_s = self.host.handoff_s(tokens, self.setup.engine.block_size)
        source.link.start(turn.request_id, tokens * self.setup.kv_bytes_per_token, self.now,
                          setup_s=setup_s)
        self._schedule_link(source)

    def _schedule_link(self, source: NodeRun) -> None:
        assert source.link is not None
        due = source.link.next_completion()
        if due is not None and due != source.link_event:
            source.link_event = due
            self._push(due, TRANSFER, source)

    def _transfer_due(self, source: NodeRun) -> None:
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


def node_config(base: EngineConfig, spec: SimNode) -> EngineConfig:
    return replace(base, role=spec.role, seed=hash_seed(base.seed, spec.name))


def hash_seed(seed: int, name: str) -> int:
    """A per-node seed that is stable across runs (unlike hash() of a str)."""
    return seed * 1_000_003 + sum((i + 1) * ord(ch) for i, ch in enumerate(name))


def engine_stats(engine: Engine) -> dict[str, Any]:
    stats = engine.stats()
    return {"prefix_cache_queries": stats.prefix_cache_queries,
            "prefix_cache_hits": stats.prefix_cache_hits,
            "external_prefix_cache_hits": stats.external_prefix_cache_hits,
            "num_preemptions": stats.num_preemptions,
            "num_evictions": stats.num_evictions}
