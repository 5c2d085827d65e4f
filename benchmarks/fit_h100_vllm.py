"""The default `h100:*` host terms fitted on real vLLM 0.24 on an H100, and how well they fit.

    python -m benchmarks.fit_h100_vllm [--data profiler/engine/data/h100_vllm_0_24/measured.json]

Prints the fitted terms, then measured beside modelled, per prompt length (client TTFT and
vLLM's own prefill time, on an idle engine: `ppd sim idle`'s model) and per decode batch
(mean TPOT: the decode step the fit uses, and the whole micro-benchmark replayed on one
engine - histories sent first, then B requests of 2,048 cached + 32 new tokens launched
together, the server's 0.85 GPU-memory share for the KV cache), twice: fitted on every
length and batches 1-100 (in sample), and fitted on half of them with the other half
predicted (out of sample).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from profiler.engine import Engine, EngineConfig, load_cost, measured
from profiler.engine.aic import AicCost
from profiler.engine.batch import BatchShape
from profiler.engine.drive import simulate
from profiler.engine.frontend import ApiServer
from profiler.engine.host import HostedCost, HostModel
from profiler.engine.idle import IdleShape, predict
from profiler.engine.requests import Request

SERVER_MEMORY_SHARE = 0.85  # the measured server's --gpu-memory-utilization
HALF_LENGTHS, HALF_BATCHES = (128, 1024, 4096), (1, 30, 100)


def micro_benchmark(cost: HostedCost, batch: int) -> tuple[float, float]:
    """Mean client TTFT and TPOT (ms) of phase C replayed on one engine."""
    ttft, tpot, _ = replay(cost, batch)
    return ttft, tpot


def server_blocks(cost: HostedCost) -> int | None:
    """The measured server's KV cache in the model: aiconfigurator's memory model at its
    0.85 memory share."""
    kernel = cost.kernel
    return (kernel.kv_blocks(16, measured.H100_SERVER_TOKEN_BUDGET, 256,
                             gpu_memory_utilization=SERVER_MEMORY_SHARE)
            if isinstance(kernel, AicCost) else None)


def replay(cost: HostedCost, batch: int,
           blocks: int | None = None) -> tuple[float, float, float]:
    """Phase C on one engine of `blocks` KV blocks (default: `server_blocks`): mean client
    TTFT and TPOT (ms), and the prompt tokens each request computed (vLLM's
    `request_prefill_kv_computed_tokens`: 32 when its whole history hit the cache)."""
    blocks = blocks or server_blocks(cost)
    config = EngineConfig(max_num_batched_tokens=measured.H100_SERVER_TOKEN_BUDGET,
                          num_kv_blocks=blocks or 32768, max_model_len=8192)
    histories = [list(range((i + 1) << 20, ((i + 1) << 20) + 2048)) for i in range(batch)]
    arrivals = [(0.0, Request(f"h{i}", max_tokens=1, prompt_token_ids=h))
                for i, h in enumerate(histories)]
    start = 60.0  # long after the histories are done
    # All B reach the API server at `start` and its one event loop takes them in turn
    # (frontend.ApiServer); each reaches the engine when its front end is done. The engine
    # runs nothing else meanwhile (the histories are done), so `running` is 0 throughout.
    api = ApiServer.for_host(cost.host)
    at_engine = [api.admit(start, measured.BURST_PROMPT_TOKENS) for _ in histories]
    arrivals += [(at, Request(
        f"r{i}", max_tokens=64, prompt_token_ids=h + list(range(1 << 40 | i << 8,
                                                                (1 << 40 | i << 8) + 32))))
        for i, (h, at) in enumerate(zip(histories, at_engine, strict=True))]
    result = simulate(Engine(config, cost), arrivals)
    done = {rid: o for rid, o in result.outcomes.items() if rid.startswith("r") and o.finished}
    # an outcome's ttft runs from its engine arrival; the client's clock started at `start`
    ttft = statistics.fmean(o.ttft + at_engine[int(rid[1:])] - start
                            for rid, o in done.items()) * 1000
    tpot = statistics.fmean(o.tpot * 1000 for o in done.values())
    computed = statistics.fmean(len(histories[0]) + 32 - o.num_cached_prompt
                                for o in done.values())
    return ttft, tpot, computed


def cache_sweep(data: measured.Measurements, blocks: list[int], batch: int = 200) -> list[str]:
    """The real cache's size, bounded by vLLM's own counter: phase C at `batch` replayed at
    each block count, its computed prompt tokens per request beside the measured ones."""
    cost = load_cost("h100:llama-3.1-8b")
    assert isinstance(cost, HostedCost)
    real = data.decode_means()[batch].computed_tokens
    lines = [f"phase C at {batch}: vLLM computed {real:.0f} prompt tokens per request "
             f"(the model's cache at {SERVER_MEMORY_SHARE}: {server_blocks(cost)} blocks)",
             "| KV blocks | computed per request | client TTFT ms | TPOT ms |", "|---|---|---|---|"]
    for count in blocks:
        ttft, tpot, computed = replay(cost, batch, count)
        lines.append(f"| {count} | {computed:.0f} | {ttft:.0f} | {tpot:.1f} |")
    return lines


def _err(model: float, real: float) -> str:
    return f"{model:.1f} ({(model - real) / real:+.0%})"


def report(data: measured.Measurements, host: HostModel, label: str,
           fitted_lengths: tuple[int, ...] | None, fitted_batches: tuple[int, ...] | None,
           replay: bool) -> list[str]:
    base = load_cost("h100:llama-3.1-8b")
    assert isinstance(base, HostedCost)
    cost = HostedCost(f"h100:llama-3.1-8b ({label})", base.kernel, host, vllm="0.24")
    lines = [f"### {label}", "",
             "| prompt tokens | set | client TTFT measured | modelled (err) "
             "| vLLM prefill time measured | modelled (err) |", "|---|---|---|---|---|---|"]
    errors: dict[str, list[float]] = {}
    for tokens, row in data.fresh_medians().items():
        kind = "fit" if fitted_lengths is None or tokens in fitted_lengths else "held out"
        ttft = predict(cost, IdleShape(prompt=tokens, max_tokens=2)).ttft_ms
        prefill = (cost.step_ms(BatchShape(1, tokens, 0, 0, 0))
                   + host.cold_step_ms(BatchShape(1, tokens, 0, 0, 0)))
        errors.setdefault(f"TTFT {kind}", []).append(abs(ttft / row.client_ttft_ms - 1))
        lines.append(f"| {tokens} | {kind} | {row.client_ttft_ms:.1f} | "
                     f"{_err(ttft, row.client_ttft_ms)} | {row.prefill_ms:.1f} | "
                     f"{_err(prefill, row.prefill_ms)} |")
    lines += ["", "| decode batch | set | TPOT measured | decode step modelled (err) "
              + ("| micro-benchmark replayed (err) | client TTFT measured | replayed (err) |"
                 if replay else "|"),
              "|---|---|---|---|" + ("---|---|---|" if replay else "")]
    for batch, row in data.decode_means().items():
        in_fit = batch in fitted_batches if fitted_batches is not None else batch <= 100
        kind = "fit" if in_fit else "held out"
        step = cost.step_ms(host.graph_shape(measured.decode_shape(batch)))
        errors.setdefault(f"TPOT {kind}", []).append(abs(step / row.tpot_ms - 1))
        cells = f"| {batch} | {kind} | {row.tpot_ms:.2f} | {_err(step, row.tpot_ms)} |"
        if replay:
            ttft, tpot = micro_benchmark(cost, batch)
            cells += (f" {_err(tpot, row.tpot_ms)} | {row.client_ttft_ms:.1f} | "
                      f"{_err(ttft, row.client_ttft_ms)} |")
        lines.append(cells)
    lines.append("")
    lines += [f"{key}: median |error| {statistics.median(v):.0%} over {len(v)}"
              for key, v in sorted(errors.items())]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=measured.DATA)
    parser.add_argument("--no-replay", action="store_true",
                        help="skip replaying the micro-benchmark (the slowest part, ~20 s)")
    parser.add_argument("--sweep-blocks", metavar="N[,N...]",
                        help="only replay phase C at 200 requests with each KV cache size and "
                             "print the prompt tokens each computed beside vLLM's own count")
    args = parser.parse_args(argv)
    data = measured.read(args.data)
    if args.sweep_blocks:
        print("\n".join(cache_sweep(data, [int(n) for n in args.sweep_blocks.split(",")])))
        return 0
    kernel = load_cost("h100:llama-3.1-8b:kernels")
    host = measured.fit_host(kernel, data)
    terms = ("frontend_request_ms", "frontend_per_token_us", "frontend_service_ms",
             "step_base_ms",
             "step_per_request_ms", "cold_step_host_ms")
    print("fitted on every length and batches 1-100: "
          + ", ".join(f"{t} {getattr(host, t):g}" for t in terms) + "\n")
    print("\n".join(report(data, host, "in sample: every length, batches 1-100", None, None,
                           not args.no_replay)) + "\n")
    half = measured.fit_host(kernel, data, lengths=HALF_LENGTHS, batches=HALF_BATCHES)
    print(f"fitted on lengths {HALF_LENGTHS} and batches {HALF_BATCHES}: "
          + ", ".join(f"{t} {getattr(half, t):g}" for t in terms) + "\n")
    print("\n".join(report(data, half, "out of sample: fitted on half, the rest predicted",
                           HALF_LENGTHS, HALF_BATCHES, not args.no_replay)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
