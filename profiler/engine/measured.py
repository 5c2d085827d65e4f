"""Real vLLM 0.24.0 on one H100, and the host terms of the default `h100:*` presets fitted on it.

The data (`data/h100_vllm_0_24/measured.json`, how it was made in the README beside it) is
what `measure.py` there read from a real server: per request, the client's TTFT and token
gaps and the server's own histograms (`vllm:request_prefill_time_seconds`,
`vllm:request_queue_time_seconds`, `vllm:time_to_first_token_seconds`,
`vllm:inter_token_latency_seconds`) over that request. `fit_host()` turns it into a
`HostModel`, term by term, against the preset's kernels (aiconfigurator's vLLM 0.24.0 data):

1. **Front end** (`frontend_request_ms`, `frontend_per_token_us`): client TTFT - the server's
   queue time - its prefill time, per fresh prompt: the HTTP request and JSON prompt, the API
   server's preprocessing, the engine-core hand-off, the first token's way back; a least-squares
   line in the prompt's length. **The API server's queue** (`frontend_service_ms`): the same
   time outside the engine, mean over B requests launched together (phase C), less that line
   at their prompt's length, against (B - 1) / 2 - the mean wait of a FIFO server that takes
   them one at a time (`frontend.ApiServer`) - least squares through the origin.
2. **Steps** (`step_base_ms`, `step_per_request_ms`): mean TPOT of B requests decoding at ~2.1k
   context - the kernels of the same CUDA-graph-padded decode step: what async scheduling
   leaves exposed per step, a least-squares line in B.
3. **A step launched on an idle engine** (`cold_step_host_ms`): the server's prefill time of
   a fresh prompt (one step: the token budget is 8,192) - the kernels of that step - the
   exposed step terms: the host work nothing hides when the batch queue was empty (host.py).
   The median over lengths.
4. `schedules_ahead` on, as vLLM 0.24's default async scheduling runs; the CUDA-graph sizes and
   NIXL terms as for every GPU preset (public.py).

Pass `lengths` / `batches` to fit on a subset (the rest is then out of sample).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from profiler.engine.batch import BatchShape
from profiler.engine.cost import CostModel
from profiler.engine.host import HostModel, vllm_capture_sizes

DATA = Path(__file__).parent / "data" / "h100_vllm_0_24" / "measured.json"
SOURCE = ("real vLLM 0.24.0 on one H100 80GB HBM3, Llama-3.1-8B (dummy weights), 2026-11-27 "
          "(profiler/engine/data/h100_vllm_0_24)")
# The micro-benchmark shape of phase C: 2048 cached + 32 new prompt tokens, 64 outputs.
DECODE_CONTEXT = 2048 + 32 + 64 // 2
BURST_PROMPT_TOKENS = 2048 + 32  # each phase C request's prompt, sent as token ids
# vLLM's default token budget on an H100 for `vllm serve`: EngineArgs.get_batch_defaults
# (vllm/engine/arg_utils.py): device memory >= 70 GiB and not an A100 -> OPENAI_API_SERVER
# 8192 (LLM class 16384); the 8,000-token prompt ran in one step here (its iteration tokens).
H100_SERVER_TOKEN_BUDGET = 8192


@dataclass(frozen=True, slots=True)
class FreshPrompt:
    """One idle-server request of `tokens` fresh prompt tokens (phase A), in ms."""

    tokens: int
    client_ttft_ms: float
    server_ttft_ms: float
    prefill_ms: float
    queue_ms: float
    itl_ms: float

    @property
    def outside_engine_ms(self) -> float:
        return self.client_ttft_ms - self.prefill_ms - self.queue_ms


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """B requests decoding together (phase C), in ms."""

    batch: int
    tpot_ms: float  # the client's mean token gap
    itl_ms: float  # the server's inter-token latency
    prefill_ms: float  # the server's mean prefill time (32 new tokens after 2,048 cached)
    client_ttft_ms: float
    queue_ms: float
    # the server's prompt tokens computed per request (vLLM's
    # request_prefill_kv_computed_tokens): 32 when the whole history hit the prefix cache
    computed_tokens: float


@dataclass(frozen=True, slots=True)
class Measurements:
    fresh: tuple[FreshPrompt, ...]
    decode: tuple[DecodeBatch, ...]

    def fresh_medians(self) -> dict[int, FreshPrompt]:
        """Per prompt length, the median of each column over the repeats."""
        return {n: _median_row(FreshPrompt, [r for r in self.fresh if r.tokens == n])
                for n in sorted({r.tokens for r in self.fresh})}

    def decode_means(self) -> dict[int, DecodeBatch]:
        """Per batch, the mean of each column over the repeats."""
        out = {}
        for b in sorted({r.batch for r in self.decode}):
            rows = [r for r in self.decode if r.batch == b]
            out[b] = DecodeBatch(b, *(statistics.fmean(getattr(r, f) for r in rows)
                                      for f in ("tpot_ms", "itl_ms", "prefill_ms",
                                                "client_ttft_ms", "queue_ms",
                                                "computed_tokens")))
        return out


def _median_row(cls: Any, rows: list[Any]) -> Any:
    first, *_ = rows
    names = [f for f in cls.__slots__ if f != "tokens"]
    return cls(first.tokens, *(statistics.median(getattr(r, f) for r in rows) for f in names))


def read(path: Path = DATA) -> Measurements:
    """The measured file's phases A (fresh prompts) and C (decode batches)."""
    try:
        phases = json.loads(path.read_text())["phases"]
        fresh = tuple(FreshPrompt(
            int(r["L"]), float(r["ttft"]), float(r["server"]["time_to_first_token_ms"]),
            float(r["server"]["request_prefill_time_ms"]),
            float(r["server"]["request_queue_time_ms"]),
            float(r["server"]["inter_token_latency_ms"])) for r in phases["A_fresh_ttft"])
        decode = tuple(DecodeBatch(
            int(r["batch"]), float(r["tpot_mean"]), float(r["server"]["inter_token_latency_ms"]),
            float(r["server"]["request_prefill_time_ms"]), float(r["ttft_mean"]),
            float(r["server"]["request_queue_time_ms"]),
            float(r["server"]["request_prefill_kv_computed_tokens"]))
            for r in phases["C_decode_only"] if r.get("variant", "decode") == "decode")
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a measure.py result with phases A and C ({exc})") from None
    if not fresh or not decode:
        raise ValueError(f"{path}: phase A or C is empty")
    return Measurements(fresh, decode)


@lru_cache(maxsize=1)
def default_measurements() -> Measurements:
    return read(DATA)


def decode_shape(batch: int) -> BatchShape:
    return BatchShape(num_decode_requests=batch, sum_decode_kv_tokens=batch * DECODE_CONTEXT)


def api_service_ms(decode: dict[int, DecodeBatch], single_ms: float) -> float:
    """The API server's time per request (ms): B requests launched together wait for it one
    at a time, (B - 1) / 2 service times on average, beyond one request's front end
    (`single_ms`); least squares through the origin over the bursts (B >= 2)."""
    bursts = [(row.batch - 1) / 2 for row in decode.values() if row.batch >= 2]
    waits = [row.client_ttft_ms - row.queue_ms - row.prefill_ms - single_ms
             for row in decode.values() if row.batch >= 2]
    if not bursts:
        return 0.0
    x, y = np.array(bursts), np.array(waits)
    return max(float(x @ y / (x @ x)), 0.0)


def fit_host(kernel: CostModel, data: Measurements | None = None, *,
             lengths: Collection[int] | None = None, batches: Collection[int] | None = None,
             num_layers: int = 32) -> HostModel:
    """The vLLM 0.24 host terms (module docstring), fitted on `lengths` of phase A and
    `batches` of phase C (default: every length, batches up to 100 - at 200 the server ran
    out of KV cache and recomputed evicted histories: a check, not a step time)."""
    from profiler.engine import public

    data = data or default_measurements()
    fresh = [r for r in data.fresh if lengths is None or r.tokens in lengths]
    decode = {b: r for b, r in data.decode_means().items()
              if (b in batches if batches is not None else b <= 100)}
    if len({r.tokens for r in fresh}) < 2 or len(decode) < 2:
        raise ValueError("the fit needs at least two prompt lengths' rows and two batches")
    graphs = HostModel(cuda_graph_sizes=vllm_capture_sizes(256))
    sizes = np.array(sorted(decode), dtype=float)
    gaps = np.array([decode[b].tpot_ms - kernel.step_ms(graphs.graph_shape(decode_shape(b)))
                     for b in sorted(decode)])
    per_request, base = (float(v) for v in np.polyfit(sizes, gaps, 1))
    base, per_request = max(base, 0.0), max(per_request, 0.0)
    tokens = np.array([r.tokens for r in fresh], dtype=float)
    outside = np.array([r.outside_engine_ms for r in fresh])
    per_token_ms, frontend = (float(v) for v in np.polyfit(tokens, outside, 1))
    service = api_service_ms(decode, frontend + per_token_ms * BURST_PROMPT_TOKENS)
    cold = statistics.median(
        r.prefill_ms - kernel.step_ms(BatchShape(1, r.tokens, 0, 0, 0)) - (base + per_request)
        for r in fresh)
    fresh_set = sorted({r.tokens for r in fresh})
    fit_a = f"{SOURCE}: fresh prompts of {', '.join(map(str, fresh_set))} tokens"
    fit_c = (f"{SOURCE}: mean TPOT of {', '.join(str(b) for b in sorted(decode))} requests "
             "decoding at ~2.1k context - the kernels of the padded step, least squares")
    descriptor_us = public.NIXL_POST_MS_PER_TRANSFER * 1000 / public.NIXL_DESCRIPTORS_PER_TRANSFER
    return HostModel(
        frontend_request_ms=round(max(frontend, 0.0), 2),
        frontend_per_token_us=round(max(per_token_ms * 1000, 0.0), 3),
        frontend_service_ms=round(service, 3),
        step_base_ms=round(base, 3),
        step_per_request_ms=round(per_request, 4),
        cuda_graph_sizes=graphs.cuda_graph_sizes,
        schedules_ahead=True,
        cold_step_host_ms=round(max(cold, 0.0), 2),
        kv_descriptor_us=round(descriptor_us, 3),
        descriptors_per_block=2 * num_layers,
        sources={
            "frontend_request_ms": f"{fit_a}: client TTFT - server queue - server prefill "
                                   "time, least-squares intercept",
            "frontend_per_token_us": f"{fit_a}: the same line's slope",
            "frontend_service_ms": (f"{SOURCE}: client TTFT - server queue - server prefill "
                                    f"time of {', '.join(str(b) for b in sorted(decode))} "
                                    "requests launched together, less the front end of one, "
                                    "against (B - 1) / 2 (a FIFO API server's mean wait), "
                                    "least squares through the origin"),
            "frontend_finish_ms": "not measured: 0",
            "step_base_ms": fit_c,
            "step_per_request_ms": fit_c,
            "step_per_token_ms": "not separable from per-request in the source: 0",
            "cuda_graph_sizes": public.VLLM_GRAPHS,
            "schedules_ahead": ("vLLM 0.24's default async scheduling: vllm/v1/engine/core.py "
                                "EngineCore.step_with_batch_queue queues the next step "
                                "before reading the running one's output"),
            "cold_step_host_ms": (f"{fit_a}: server prefill time - the kernels of the one "
                                  "prefill step - the exposed step terms, median over lengths"),
            "async_scheduling": ("off: steps' exposed host time is fitted directly "
                                 "(step_base_ms, step_per_request_ms)"),
            "kv_handoff_ms": ("0: D's step alignment (pull issued at a step, completion "
                              "seen at a step end) is modelled by the engine itself"),
            "kv_descriptor_us": (f"{public.NIXL_RFC}: {public.NIXL_POST_MS_PER_TRANSFER} ms "
                                 f"post per {public.NIXL_DESCRIPTORS_PER_TRANSFER} descriptors"),
            "descriptors_per_block": ("assumed: one NIXL descriptor per (layer, K/V, block); "
                                      "#50913 moved ~94 KB per descriptor"),
        })
