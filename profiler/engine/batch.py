"""What one engine step computes: the batch's shape, the input of every step-cost model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What one forward pass computes.

    Prefill items are prompt chunks (their tokens attend to `sum_prefill_kv_tokens` earlier
    tokens in total); decode items compute one token each over `sum_decode_kv_tokens` of
    context in total."""

    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0
    sum_prefill_kv_tokens: int = 0
    num_decode_requests: int = 0
    sum_decode_kv_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return self.num_prefill_requests == 0 and self.num_decode_requests == 0

    @property
    def num_tokens(self) -> int:
        return self.sum_prefill_tokens + self.num_decode_requests
