"""`ppd sim live-costs`: the step-cost file `--policy live` reads, fitted to a cost preset.

    ppd sim live-costs --cost h100:llama-3.1-8b --link nvlink --out costs/h100-8b.json

The policy needs a model of one engine step it can evaluate in microseconds
(`proxy.live.predict.StepCosts`, linear in the batch's features); the cost presets are
aiconfigurator's
kernel data (docs/engine-model.md), evaluated per batch shape. This samples a preset over the
shapes a turn decision asks about - prefill chunks of 16..8192 tokens after 0..16k cached
tokens, decode batches of 1..256 requests at 256..16k tokens of context, and both mixed - and
fits the linear form by least squares on relative error (a 10 ms decode step matters as much
as a 200 ms prefill). The transfer terms come from the link preset and the model's KV bytes
per token. A `ppd sim fit` preset (already linear: a CPU cluster) is read as is. A
kernels + host preset (`ppd sim calibrate`, or the default GPU presets) adds its P->D hand-off
and the extra front end of a P->D turn to the transfer terms.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

import numpy as np

from profiler.engine.config import EngineConfig
from profiler.engine.cost import BatchShape, CostModel, LinearCost
from profiler.engine.host import HostedCost
from profiler.engine.presets import cached_cost
from profiler.engine.transfer import Link, load_link, load_model_shape
from proxy.live.predict import StepCosts

# vLLM's default --block-size, the simulator's too (`EngineConfig`).
DEFAULT_BLOCK_SIZE = EngineConfig().block_size
_PREFILL = (16, 64, 256, 1024, 2048, 4096, 8192)
_PREFILL_CTX = (0, 512, 2048, 8192, 16384)
_BATCH = (1, 4, 16, 32, 64, 128, 256)
_CONTEXT = (256, 1024, 4096, 16384)


def _features(prefill: int, ctx: int, batch: int, kv: int) -> list[float]:
    attention = prefill * (ctx + prefill / 2) / 1000.0
    return [1.0, float(prefill), float(batch), kv / 1000.0, attention]


def fit_step_costs(cost: CostModel, link: Link, kv_bytes_per_token: int,
                   block_size: int = DEFAULT_BLOCK_SIZE) -> StepCosts:
    """A linear StepCosts fitted to cost's step times, plus link's transfer terms (a
    hosted preset's connector terms per `block_size`-token block)."""
    transfer_base = link.latency_s * 1000.0
    transfer_per_ktoken = kv_bytes_per_token * 1000.0 / link.bandwidth_bytes_per_s * 1000.0
    source = f"fitted to {cost.name} ({cost.source}); transfer: {link.name} ({link.source})"
    if isinstance(cost, LinearCost):
        return StepCosts(cost.base_ms, cost.per_prefill_token_ms, cost.per_decode_seq_ms,
                         cost.per_decode_kv_ktoken_ms, cost.per_prefill_attention_ms,
                         transfer_base, transfer_per_ktoken,
                         source=f"{cost.name} ({cost.source})")
    rows, times = [], []
    shapes = [(p, c, 0, 0) for p in _PREFILL for c in _PREFILL_CTX]
    shapes += [(0, 0, b, b * c) for b in _BATCH for c in _CONTEXT]
    shapes += [(p, c, b, b * k) for p in _PREFILL[:5] for c in (0, 2048)
               for b in (16, 64) for k in (1024, 4096)]
    for prefill, ctx, batch, kv in shapes:
        shape = BatchShape(1 if prefill else 0, prefill, ctx if prefill else 0, batch, kv)
        rows.append(_features(prefill, ctx, batch, kv))
        times.append(cost.step_ms(shape))
    x, y = np.array(rows), np.array(times)
    weights = 1.0 / y
    coef, *_ = np.linalg.lstsq(x * weights[:, None], y * weights, rcond=None)
    base, per_token, per_seq, per_kv, attention = (max(0.0, float(c)) for c in coef)
    if isinstance(cost, HostedCost):
        # What a transfer pays beyond the link: the connector's hand-off and, per token,
        # its own work and NIXL's descriptors (descriptors_per_block per block:
        # `HostModel.handoff_s`, which the simulator charges every transfer - a readback's
        # read too). The front ends are apart (`frontend_base_ms`): a P->D turn passes two
        # API servers, a readback three (P's /tokenize first).
        host = cost.host
        transfer_base += host.kv_handoff_ms
        # Each per-token term in us is, per 1,000 tokens, the same number of ms.
        transfer_per_ktoken += (host.kv_per_token_us
                                + host.kv_descriptor_us * host.descriptors_per_block
                                / block_size)
        # One pass through an API server (the API server's queue is not known to a proxy,
        # so its service time is left out).
        frontend_base, frontend_per_ktoken = host.frontend_request_ms, host.frontend_per_token_us
        source += f"; hand-off, descriptors and front end: {cost.name}'s host terms"
    else:
        frontend_base = frontend_per_ktoken = 0.0
    return StepCosts(base, per_token, per_seq, per_kv, attention, transfer_base,
                     transfer_per_ktoken, frontend_base, frontend_per_ktoken, source=source)


@lru_cache(maxsize=8)
def step_costs_for(cost: str, link: str, model: str) -> StepCosts:
    """The fitted StepCosts of a (cost preset, link, model), once per process."""
    return fit_step_costs(cached_cost(cost), load_link(link),
                          load_model_shape(model).kv_bytes_per_token)


def fit_error(costs: StepCosts, cost: CostModel) -> float:
    """Median relative error of the fit over mixed shapes it was not fitted on."""
    errors = []
    for prefill in (32, 128, 512, 1500):
        for batch in (8, 48):
            shape = BatchShape(1, prefill, 1000, batch, batch * 2000)
            true = cost.step_ms(shape)
            guess = costs.step_ms(prefill, 1000, batch, batch * 2000)
            errors.append(abs(guess - true) / true)
    return float(np.median(errors))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="ppd sim live-costs",
        description="Write the step-cost file `ppd proxy --policy live --live-costs` reads, "
        "fitted to a cost preset and a link.")
    parser.add_argument("--cost", default="h100:llama-3.1-8b",
                        help="cost preset or `ppd sim fit` JSON (default h100:llama-3.1-8b)")
    parser.add_argument("--model", help="model whose KV moves (default: the model of --cost)")
    parser.add_argument("--link", default="nvlink", help="nvlink, rdma-400g, tcp-25g")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    model = args.model or (args.cost.partition("@")[0].split(":")[1] if ":" in args.cost
                           else None)
    if model is None:
        parser.error("--cost names no model: pass --model for the KV size")
    try:
        costs = step_costs_for(args.cost, args.link, model)
    except ValueError as exc:
        parser.error(str(exc))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(costs), indent=2) + "\n")
    print(f"wrote {args.out}: median error {fit_error(costs, cached_cost(args.cost)):.1%} "
          "on held-out mixed steps")
    return 0
