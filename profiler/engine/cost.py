"""Step cost models: how long one engine step takes for the batch it runs.

A step is described by a `BatchShape` (`profiler.engine.batch`: the same features NVIDIA's
aiconfigurator forward-pass model takes), and a `CostModel` turns it into milliseconds.
Presets are named and record their source: `aic.py` (GPUs, measured kernel data) and
`LinearCost` (fitted to this machine's vLLM-CPU cluster by `ppd sim fit`, stored as JSON).
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Protocol

from profiler.engine.batch import BatchShape


class CostModel(Protocol):
    """A step-cost preset: the time of one step, and the KV cache the hardware holds."""

    @property
    def name(self) -> str: ...

    @property
    def source(self) -> str:
        """Where the numbers come from (recorded in every table made with this model)."""
        ...

    def step_ms(self, shape: BatchShape) -> float:
        """Modelled wall time of one step, in milliseconds (0 for an empty batch)."""
        ...

    def kv_blocks(self, block_size: int, max_num_batched_tokens: int,
                  max_num_seqs: int) -> int | None:
        """vLLM's num_gpu_blocks on the preset's hardware for these engine limits; None when
        the preset models no memory (the engine config's own KV size then applies)."""
        ...


@dataclass(frozen=True, slots=True)
class LinearCost:
    """A per-step cost linear in the batch's features.

    step = base + per_prefill_token * P + per_prefill_attention * P * (context + P / 2) / 1000
           + per_decode_seq * D + per_decode_kv_token * KV / 1000
    (attention terms per thousand tokens to keep the coefficients readable)."""

    name: str
    source: str
    base_ms: float
    per_prefill_token_ms: float
    per_decode_seq_ms: float
    per_decode_kv_ktoken_ms: float = 0.0
    per_prefill_attention_ms: float = 0.0

    def step_ms(self, shape: BatchShape) -> float:
        if shape.is_empty:
            return 0.0
        prefill = shape.sum_prefill_tokens
        # Mean context a prefill token attends to: what precedes the chunk plus half of it.
        mean_context = (shape.sum_prefill_kv_tokens / max(shape.num_prefill_requests, 1)
                        + prefill / max(shape.num_prefill_requests, 1) / 2)
        return (self.base_ms
                + self.per_prefill_token_ms * prefill
                + self.per_prefill_attention_ms * prefill * mean_context / 1000
                + self.per_decode_seq_ms * shape.num_decode_requests
                + self.per_decode_kv_ktoken_ms * shape.sum_decode_kv_tokens / 1000)

    def kv_blocks(self, block_size: int, max_num_batched_tokens: int,
                  max_num_seqs: int) -> int | None:
        """None: a fitted CPU preset times steps only (vLLM-CPU's KV size is a flag)."""
        return None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "linear", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> LinearCost:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known - {"kind"}
        if unknown:
            raise ValueError(f"unknown LinearCost keys: {sorted(unknown)}")
        missing = {f.name for f in fields(cls) if f.default is MISSING} - set(data)
        if missing:
            raise ValueError(f"linear cost preset: missing {sorted(missing)}")
        values = {k: v for k, v in data.items() if k in known}
        for key in known - {"name", "source"}:
            if key in values:
                check_term("linear cost preset", key, values[key])
        return cls(**values)  # type: ignore[arg-type]


def check_term(where: str, key: str, value: object) -> None:
    """A time term of a cost preset file is a finite number >= 0: the fits clamp theirs at
    0, and a NaN or negative one gave NaN or negative TTFTs without a word."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value < 0):
        raise ValueError(f"{where}: {key} must be a finite number >= 0 (got {value!r})")

