"""What the engine model is asked to run, and its running record of each request.

A `Request` is what a client submits (immutable). A `Sequence` is the engine's running record
of it: tokens computed so far, tokens emitted, the KV blocks it holds, its phase and times.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field


class RequestRejected(ValueError):
    """The request can never run on this engine (too long for the model or the KV cache).

    vLLM answers these with HTTP 400 before scheduling; an emulator should do the same."""


class Phase(enum.StrEnum):
    WAITING = "waiting"  # queued: not yet admitted (or preempted back to the queue)
    WAITING_KV = "waiting_kv"  # blocks allocated on D; its prompt KV is still in flight from P
    RUNNING = "running"  # admitted: prefilling in chunks or decoding
    FINISHED = "finished"
    FAILED = "failed"  # aborted by the caller


@dataclass(frozen=True, slots=True)
class Request:
    """One generation request.

    The prompt is given as token ids (the prefix cache hashes them block by block, as vLLM
    does) or, for traces that carry only block hashes (e.g. Mooncake's `hash_ids`), as
    `prompt_len` plus `block_hashes` (one per full block, already chained).

    - `kv_from`: the prompt's KV is computed elsewhere (a P node) and pulled by this node:
      the request waits in WAITING_KV until `Engine.kv_arrived(id)`, then decodes.
    - `send_kv`: this node is a P for the request: after it finishes, its KV blocks stay held
      for the D to read until `Engine.release_kv(id)` (vLLM's delayed free).
    - `keep_kv`: this node is a D that keeps the finished request's blocks for a readback
      (vLLM's bidirectional NIXL, `decoder_kv_blocks_ttl`): held, like `send_kv`'s, until
      `Engine.release_kv(id)` - when P has read them, or the TTL has passed.
    - `preloaded`: leading prompt tokens whose KV this node read from another before the
      request reached it (a P reading the history back from a D: vLLM's bidirectional
      NIXL, docs/readback.md); they count as computed at admission, like a prefix-cache hit.
    - `prompt_hashes`: the chained hashes (`prefix_cache.block_hashes`) of
      `prompt_token_ids`' full blocks at the engine's block size, when the caller has them:
      the engine uses them instead of hashing the prompt (a simulator sends one prompt to a
      P and a D, and the same recorded prompt in run after run). None: the engine hashes.
    - `output_token_ids`: the ids to emit, in order (e.g. the text an emulator sends back,
      which the next turn's prompt repeats, so the prefix cache sees the same blocks vLLM
      would); at least `max_tokens` of them. Default: draws from the engine's seeded RNG.
    """

    id: str
    max_tokens: int
    prompt_token_ids: SequenceOf[int] | None = None
    prompt_len: int | None = None
    block_hashes: tuple[int, ...] | None = None
    kv_from: str | None = None
    send_kv: bool = False
    keep_kv: bool = False
    output_token_ids: SequenceOf[int] | None = None
    preloaded: int = 0
    prompt_hashes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if (self.prompt_token_ids is None) == (self.prompt_len is None):
            raise ValueError("give exactly one of prompt_token_ids or prompt_len")
        if self.prompt_hashes is not None and self.prompt_token_ids is None:
            raise ValueError("prompt_hashes are the hashes of prompt_token_ids: give both "
                             "(a prompt given by length takes block_hashes)")
        if self.prompt_len is not None and self.block_hashes is None:
            raise ValueError("prompt_len needs block_hashes (one per full block)")
        if self.num_prompt_tokens < 1:
            raise RequestRejected(f"request {self.id}: empty prompt")
        if self.max_tokens < 1:
            raise RequestRejected(f"request {self.id}: max_tokens must be at least 1")
        if self.output_token_ids is not None and len(self.output_token_ids) < self.max_tokens:
            raise ValueError(f"request {self.id}: {len(self.output_token_ids)} output token ids "
                             f"for max_tokens {self.max_tokens}")
        if self.kv_from is not None and self.send_kv:
            raise ValueError("a request cannot both receive and send its KV")

    @property
    def num_prompt_tokens(self) -> int:
        if self.prompt_token_ids is not None:
            return len(self.prompt_token_ids)
        assert self.prompt_len is not None
        return self.prompt_len


@dataclass(slots=True)
class Sequence:
    """The engine's running record of one request. Times are the caller's clock (seconds)."""

    request: Request
    arrival: float
    block_hashes: list[int]  # chained hashes of full blocks known so far (grows with outputs)
    phase: Phase = Phase.WAITING
    num_computed: int = 0  # tokens whose KV is in the cache (prompt, then outputs)
    output_token_ids: list[int] = field(default_factory=list)
    num_cached_prompt: int = 0  # prompt tokens found in the local prefix cache at admission
    num_external: int = 0  # prompt tokens received from a P (kv_from)
    kv_received: bool = False
    held_hashes: list[int] = field(default_factory=list)  # full blocks registered in the cache
    anon_blocks: int = 0  # blocks held that are not (yet) full or not hashable
    first_token_time: float | None = None
    scheduled_time: float | None = None  # start of its first step (vLLM's queue time ends)
    finish_time: float | None = None
    num_preemptions: int = 0
    error: str | None = None

    @property
    def id(self) -> str:
        return self.request.id

    num_prompt: int = 0  # set from the request (a field: read on every step)

    def __post_init__(self) -> None:
        self.num_prompt = self.request.num_prompt_tokens

    @property
    def num_tokens(self) -> int:
        """Prompt plus the outputs generated so far."""
        return self.num_prompt + len(self.output_token_ids)

    @property
    def num_blocks_held(self) -> int:
        return len(self.held_hashes) + self.anon_blocks
