"""One engine node's configuration: a frozen dataclass, validated once."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from proxy.shared.vocabulary import Role


class SchedulePolicy(enum.StrEnum):
    # vLLM v1: running requests (decodes, ongoing chunks) first, then new prompts' chunks fill
    # what is left of the token budget in the same step - prefill mixed into decode batches.
    DECODE_FIRST = "decode-first"
    # nano-vllm: a step prefills whenever some prompt can be scheduled, and only then decodes;
    # the two never share a step.
    PREFILL_FIRST = "prefill-first"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """vLLM's scheduling knobs plus the KV-cache size.

    - `max_num_batched_tokens`: token budget of one step (vLLM --max-num-batched-tokens);
    - `max_num_seqs`: requests running at once (vLLM --max-num-seqs);
    - `chunk_size`: the most prompt tokens one request may take in a step (vLLM's
      long_prefill_token_threshold); None = the whole budget;
    - `num_kv_blocks` x `block_size`: the KV cache (vLLM's num_gpu_blocks, --block-size);
    - `seed`: output token ids are drawn from it (everything else is deterministic anyway).
    """

    role: Role = Role.REPLICA  # the proxy's roles: one enum for every layer
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    chunk_size: int | None = None
    num_kv_blocks: int = 32768
    block_size: int = 16
    max_model_len: int = 131072
    policy: SchedulePolicy = SchedulePolicy.DECODE_FIRST
    vocab_size: int = 128256
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "num_kv_blocks", "block_size",
                     "max_model_len", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be at least 1")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError("EngineConfig.chunk_size must be at least 1 (or None)")
        object.__setattr__(self, "role", Role(self.role))
        object.__setattr__(self, "policy", SchedulePolicy(self.policy))

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size
