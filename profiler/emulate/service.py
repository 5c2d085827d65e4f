"""One emulated vLLM node's request handling: prompt -> engine job -> tokens -> OpenAI answers.

The P/D protocol as vLLM's NixlConnector plays it:
- P leg (kv_transfer_params.do_remote_decode): the prompt is prefilled, the one requested token
  returned with kv_transfer_params naming this node's engine and the request, and the KV is
  held until the D has pulled it (or HOLD_TIMEOUT_S passes).
- D leg (kv_transfer_params.do_remote_prefill): the prompt tokens this node does not hold are
  pulled from the P over P's link (bytes = tokens x KV bytes per token); the request is
  scheduled once they arrived, recomputing only the last prompt token, then decodes.
- With `readback_ttl_s` (vLLM's bidirectional_kv_xfer; docs/readback.md) a D's whole answer
  to a D leg names its blocks (`do_remote_decode`, `remote_num_tokens`: the prompt and all but
  the last generated token), and a P leg that carries such params first moves the KV of the
  tokens it does not cache over that D's link, then computes only the rest. D keeps those
  blocks pinned (they count as used, never evicted) until that P has read them or the TTL
  passes - streamed legs' blocks too, as vLLM's D does, although it names them only in a
  whole answer.
- A local leg (no kv_transfer_params) is an ordinary request: its prompt's prefix found in this
  node's cache (an earlier turn's prompt and reply) is not prefilled again.

A node given a `KvEventPublisher` (a D or R of `ppd cluster up --emulate`) publishes its
engine's KV cache events, each request's stores tagged with its `session_id` field.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from profiler.emulate.engine_interface import Job, JobRejected, NodeEngine
from profiler.emulate.kv_publisher import KvEventPublisher
from profiler.emulate.link import WallClockLink
from profiler.emulate.metrics import NodeMetrics
from profiler.emulate.openai_format import DONE, Envelope, Parsed, RequestError, sse, usage
from profiler.emulate.runtime import EmulatedNode, EngineFailed, Stream
from profiler.emulate.tokenizer import Vocabulary
from profiler.engine.transfer import Link
from proxy.shared.vocabulary import Role

# vLLM's default NIXL side-channel port (vllm/envs.py, VLLM_NIXL_SIDE_CHANNEL_PORT).
VLLM_NIXL_SIDE_CHANNEL_PORT = 5600


@dataclass(frozen=True, slots=True)
class EmulatedNodeSpec:
    """What one emulated node is: role, served model, timing preset and limits."""

    name: str
    role: Role
    model: str
    preset: str
    max_model_len: int = 8192
    kv_bytes_per_token: int = 131072  # Llama-3.1-8B bf16: 32 layers x 8 KV heads x 128 x 2 x 2
    link_bandwidth_bytes_s: float = 450e9
    link_latency_s: float = 0.0
    report_cached_tokens: bool = False  # vLLM's --enable-prompt-tokens-details
    # The preset's modelled host side beyond step times (profiler.engine.host): the API
    # server's time per request (slept before the engine sees it, on top of this machine's
    # real HTTP and tokenizer) and D's per-transfer hand-off.
    frontend_request_s: float = 0.0
    frontend_per_token_s: float = 0.0
    frontend_per_running_s: float = 0.0
    # How long a request holds the API server's one event loop (a FIFO queue:
    # profiler.engine.frontend); 0: the front end is a delay, no queue.
    frontend_service_s: float = 0.0
    handoff_fixed_s: float = 0.0
    handoff_per_token_s: float = 0.0
    host: str = "127.0.0.1"
    port: int = 0
    readback_ttl_s: float | None = None  # D keeps a turn's blocks for a readback (None: off)

    @property
    def side_channel_port(self) -> int:
        """The NIXL side-channel port its kv_transfer_params name: its own port, else (a port
        the OS chose) vLLM's default, VLLM_NIXL_SIDE_CHANNEL_PORT=5600 - never 0, which the
        proxy refuses as implausible (proxy.readback.protocol.plausible_params)."""
        return self.port or VLLM_NIXL_SIDE_CHANNEL_PORT

    def frontend_s(self, prompt_tokens: int, running: int = 0) -> float:
        return (self.frontend_request_s + self.frontend_per_token_s * prompt_tokens
                + self.frontend_per_running_s * running)


@dataclass(slots=True)
class Peers:
    """The nodes of one process, by engine id, so a D can pull from its P's link."""

    nodes: dict[str, NodeService] = field(default_factory=dict)


class NodeService:
    """Serves completions for one emulated node."""

    def __init__(self, spec: EmulatedNodeSpec, engine: NodeEngine, vocab: Vocabulary,
                 peers: Peers | None = None, publisher: KvEventPublisher | None = None
                 ) -> None:
        self.spec = spec
        self.vocab = vocab
        self.engine_id = f"ppd-emulated-{spec.name}-{id(self):x}"
        self.publisher = publisher
        self.node = EmulatedNode(engine, on_token=self._on_token, on_pull=self._on_pull,
                                 on_kv_events=publisher.publish if publisher else None)
        # This node's egress as a P; transfers from a P this process does not host run on a
        # link of the same preset.
        link = Link(f"{spec.name} egress", spec.link_bandwidth_bytes_s, spec.link_latency_s,
                    "the node's spec")
        self.link = WallClockLink(link)
        self._foreign = WallClockLink(link)
        self._pulling: dict[str, Prepared] = {}
        self._pulls: set[asyncio.Task[None]] = set()
        self.peers = peers if peers is not None else Peers()
        self.peers.nodes[self.engine_id] = self
        self.metrics = NodeMetrics(
            spec.model, engine.stats, self.node.pacing,
            {"block_size": str(engine.block_size), "cache_dtype": "auto",
             "enable_prefix_caching": "True"}, spec.preset,
            (lambda: publisher.dropped) if publisher is not None else None,
        )  # fmt: skip
        self._ids = itertools.count()
        self._last_token: dict[str, float] = {}

    async def start(self) -> None:
        if self.publisher is not None:
            await self.publisher.start()
        await self.node.start()

    async def stop(self) -> None:
        await self.node.stop()
        if self.publisher is not None:
            await self.publisher.stop()

    def _on_token(self, stream: Stream, now: float, n: int) -> None:
        last = self._last_token.get(stream.job.id)
        if last is None:
            self.metrics.ttft.observe(now - stream.arrival)
        else:
            self.metrics.itl.observe(now - last)
            self.metrics.tpot.observe(now - last)
        self._last_token[stream.job.id] = now
        self.metrics.generation_tokens.inc(n)

    # ------------------------------------------------------------------------------- requests

    def prepare(self, parsed: Parsed, request_id: str) -> Prepared:
        """Check the request against the model and tokenize it (RequestError when invalid)."""
        if parsed.model and parsed.model != self.spec.model:
            raise RequestError(f"The model `{parsed.model}` does not exist.", 404, "model",
                               "NotFoundError")
        if parsed.messages is not None:
            prompt = self.vocab.encode_chat(parsed.messages)
        elif parsed.prompt_ids is not None:
            prompt = parsed.prompt_ids
        else:
            prompt = self.vocab.encode_text(parsed.prompt_text or "")
        limit = self.spec.max_model_len
        if not prompt:
            raise RequestError("the prompt is empty", param="prompt")
        if len(prompt) >= limit:
            raise RequestError(f"This model's maximum context length is {limit} tokens. However,"
                               f" your request has {len(prompt)} input tokens.", param="messages")
        max_tokens = parsed.max_tokens if parsed.max_tokens is not None else limit - len(prompt)
        if len(prompt) + max_tokens > limit:
            raise RequestError(
                f"'max_tokens' is too large: {max_tokens}. This model's maximum context length "
                f"is {limit} tokens and your request has {len(prompt)} input tokens "
                f"({max_tokens} > {limit} - {len(prompt)}).", param="max_tokens")  # fmt: skip
        job_id = f"{request_id}-{next(self._ids)}"
        output = self.vocab.reply_ids(max_tokens, seed=job_id)
        # A D or kept local leg (it came with kv_transfer_params) on a node with bidirectional
        # transfer keeps its blocks when it ends (vLLM's request_finished on D).
        keeps = (parsed.kv_transfer_params is not None and not parsed.wants_remote_decode
                 and self.spec.readback_ttl_s is not None)
        job = Job(job_id, prompt, output, remote_kv=parsed.wants_remote_prefill,
                  hold_kv=parsed.wants_remote_decode,
                  keep_kv_s=self.spec.readback_ttl_s if keeps else None,
                  session_id=parsed.session_id,
                  preloaded=self._read_back_tokens(parsed, prompt))
        return Prepared(parsed, job, Envelope.new(request_id, self.spec.model, parsed.chat))

    def tokenize(self, parsed: Parsed) -> list[int]:
        """The prompt's ids, as a completion request would have them (vLLM's /tokenize)."""
        if parsed.messages is not None:
            return self.vocab.encode_chat(parsed.messages)
        if parsed.prompt_ids is not None:
            return parsed.prompt_ids
        return self.vocab.encode_text(parsed.prompt_text or "")

    def _read_back_tokens(self, parsed: Parsed, prompt: list[int]) -> int:
        """A readback P leg's tokens read from D: min(remote_num_tokens, prompt), as vLLM's
        P takes them (the proxy made them the new prompt's)."""
        if not parsed.reads_back or self.spec.readback_ttl_s is None:
            return 0
        told = (parsed.kv_transfer_params or {}).get("remote_num_tokens")
        return min(told, len(prompt) - 1) if isinstance(told, int) and told > 0 else 0

    async def read_back(self, prepared: Prepared) -> None:
        """A readback P leg: move the history's KV this node does not cache from the D over
        the D's link before the job is submitted."""
        job = prepared.job
        if not job.preloaded:
            return
        params = prepared.parsed.kv_transfer_params or {}
        source = self.peers.nodes.get(str(params.get("remote_engine_id")))
        link = source.link if source is not None else self._foreign
        cached = self.node.engine.cached_tokens(job.prompt_ids[:job.preloaded])
        tokens = job.preloaded - min(cached, job.preloaded)
        handoff = self.spec.handoff_fixed_s + self.spec.handoff_per_token_s * tokens
        if handoff > 0:
            await asyncio.sleep(handoff)
        if tokens <= 0:
            return  # nothing read: D keeps its blocks until their TTL
        try:
            await link.transfer(tokens * self.spec.kv_bytes_per_token)
        finally:
            # P tells D it has read the blocks (or gave up): D frees them before their TTL.
            if source is not None and params.get("remote_request_id"):
                source.node.hold_released(str(params["remote_request_id"]))

    def start_job(self, prepared: Prepared) -> Running:
        """Submit the job (RequestError if it can never run here); tokens follow on Running."""
        try:
            stream = self.node.submit(prepared.job)
        except JobRejected as exc:
            raise RequestError(str(exc)) from None
        except EngineFailed as exc:
            raise RequestError(str(exc), 500, kind="InternalServerError") from None
        self.metrics.prompt_tokens.inc(len(prepared.job.prompt_ids))
        if prepared.job.remote_kv:
            self._pulling[prepared.job.id] = prepared
        return Running(self, prepared, stream)

    def _on_pull(self, job_id: str, tokens: int) -> None:
        prepared = self._pulling.get(job_id)
        if prepared is not None:
            task = asyncio.create_task(self._pull(prepared, tokens))
            self._pulls.add(task)
            task.add_done_callback(self._pulls.discard)

    async def _pull(self, prepared: Prepared, tokens: int) -> None:
        """Move `tokens` of KV from the P over its link, then let the job run."""
        params = prepared.parsed.kv_transfer_params or {}
        source = self.peers.nodes.get(str(params.get("remote_engine_id")))
        link = source.link if source is not None else self._foreign
        try:
            handoff = self.spec.handoff_fixed_s + self.spec.handoff_per_token_s * tokens
            if handoff > 0:
                await asyncio.sleep(handoff)
            await link.transfer(tokens * self.spec.kv_bytes_per_token)
        finally:
            if source is not None and params.get("remote_request_id"):
                source.node.hold_released(str(params["remote_request_id"]))
        if self._pulling.pop(prepared.job.id, None) is not None:
            self.node.kv_arrived(prepared.job.id)

    def forget(self, job_id: str) -> None:
        """A job's answer ended (finished or the client left): drop what tracks it."""
        self._last_token.pop(job_id, None)
        self._pulling.pop(job_id, None)
        self.node.abort(job_id)

    def kept_params(self, job: Job, produced: int) -> dict[str, Any]:
        """What a D with bidirectional transfer returns for a finished D leg: the blocks it
        keeps for the next turn's P to read back (vLLM's request_finished on D)."""
        return _kept_params(self, job, produced)

    def kv_transfer_params(self, job: Job) -> dict[str, Any]:
        """What P returns for its D: where the KV is and under which request (NixlConnector)."""
        blocks = math.ceil(len(job.prompt_ids) / self.node.engine.block_size)
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": list(range(blocks)), "remote_engine_id": self.engine_id,
                "remote_host": self.spec.host, "remote_port": self.spec.side_channel_port,
                "tp_size": 1, "remote_request_id": job.id}  # fmt: skip


def _kept_params(service: NodeService, job: Job, produced: int) -> dict[str, Any]:
    computed = len(job.prompt_ids) + produced - 1  # the last token's KV is never computed
    blocks = math.ceil(computed / service.node.engine.block_size)
    return {"do_remote_prefill": False, "do_remote_decode": True,
            "remote_block_ids": list(range(blocks)), "remote_engine_id": service.engine_id,
            "remote_host": service.spec.host, "remote_port": service.spec.side_channel_port,
            "tp_size": 1,
            "remote_request_id": job.id, "remote_num_tokens": computed}


@dataclass(frozen=True, slots=True)
class Prepared:
    parsed: Parsed
    job: Job
    envelope: Envelope


@dataclass(slots=True)
class Running:
    """A submitted job; iterate `sse()` for a streamed answer or await `answer()`."""

    service: NodeService
    prepared: Prepared
    stream: Stream
    produced: int = 0

    @property
    def _job(self) -> Job:
        return self.prepared.job

    def _usage(self) -> dict[str, Any]:
        cached = self.stream.cached_tokens if self.service.spec.report_cached_tokens else None
        return usage(len(self._job.prompt_ids), self.produced, cached)

    async def _texts(self) -> AsyncGenerator[str, None]:
        try:
            async for n in self.stream.tokens():
                ids = self._job.output_ids[self.produced:self.produced + n]
                self.produced += n
                yield self.service.vocab.decode(ids)
            self.service.metrics.succeeded("length")
            self.service.metrics.e2e.observe(self.service.node.now() - self.stream.arrival)
        finally:
            self.service.forget(self._job.id)

    async def answer(self) -> dict[str, Any]:
        parts = [text async for text in self._texts()]
        job, service = self._job, self.service
        kv = service.kv_transfer_params(job) if job.hold_kv else None
        asked = self.prepared.parsed.kv_transfer_params is not None  # a D or kept local leg
        if asked and not job.hold_kv and service.spec.readback_ttl_s is not None:
            kv = service.kept_params(job, self.produced)
        answer = self.prepared.envelope.complete("".join(parts), "length", self._usage(), kv)
        if self.prepared.parsed.return_token_ids:
            answer["prompt_token_ids"] = list(job.prompt_ids)
            answer["choices"][0]["token_ids"] = list(job.output_ids[:self.produced])
        return answer

    async def sse(self) -> AsyncIterator[bytes]:
        envelope = self.prepared.envelope
        texts = self._texts()
        try:
            first = True
            async for text in texts:
                if first and envelope.chat:
                    yield envelope.chunk(None, role=True)
                first = False
                done = self.produced >= len(self._job.output_ids)
                yield envelope.chunk(text, "length" if done else None)
            if self.prepared.parsed.include_usage:
                yield envelope.usage_chunk(self._usage())
            yield DONE
        except EngineFailed as exc:  # what vLLM streams when a request fails mid-answer
            yield sse({"error": RequestError(str(exc), 500, kind="InternalServerError"
                                             ).body()["error"]})
            yield DONE
        finally:
            await texts.aclose()
