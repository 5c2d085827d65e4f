"""The H100 preset against inference-sim's sim-to-real measurements, per experiment and stage.

    python -m benchmarks.h100_sim_to_real [--preset h100:llama-3.1-8b@vllm-0.13] [--seconds 120]

Held out: no constant of the preset comes from these numbers (its front end was fitted on the
study's summary range, `public.SIM_TO_REAL_TTFT_MS`; see docs/engine-model.md). Each stage runs
one engine (vLLM 0.15.1's max_num_seqs 128 and the stage's token budget) in virtual time:
constant arrivals at the stage's rate, each prompt a group's shared system prompt plus its own
question (inference-perf's shared_prefix data), a fixed number of outputs (ignore_eos). TTFT is
the engine's first token plus the preset's front end; TPOT is (E2E - TTFT) / (outputs - 1) of
the means, as the measured column is computed from the study's means. vLLM 0.15.1 lies
between the two engines ppd models, so both are printed: `--preset` (default the paper's
vLLM 0.13 engine, `h100:llama-3.1-8b@vllm-0.13`) with its synchronous scheduling and with
async scheduling (0.15.1's default), and the default vLLM 0.24 preset (`--newer`).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from dataclasses import replace

from profiler.engine import Engine, EngineConfig, load_cost, public
from profiler.engine.cost import CostModel
from profiler.engine.drive import simulate
from profiler.engine.host import HostedCost, host_of
from profiler.engine.requests import Request

# Token ids far above Llama-3's vocabulary: system prompts per group, then fresh questions.
_SYSTEM_BASE, _QUESTION_BASE = 1 << 40, 1 << 41


def predict(stage: public.SimToRealStage, cost: CostModel,
            seconds: float) -> tuple[float, float]:
    """Mean TTFT and TPOT (ms) of the stage's requests on one simulated engine."""
    config = EngineConfig(max_num_seqs=128, max_num_batched_tokens=stage.max_num_batched_tokens,
                          max_model_len=4096)
    engine = Engine(config, cost)
    questions = itertools.count(_QUESTION_BASE, stage.question_tokens)
    arrivals = []
    duration = min(seconds, stage.duration_s)
    for index in range(int(stage.rate * duration)):
        group = index % stage.system_groups
        system = range(_SYSTEM_BASE + group * stage.system_tokens,
                       _SYSTEM_BASE + (group + 1) * stage.system_tokens)
        first = next(questions)
        prompt = [*system, *range(first, first + stage.question_tokens)]
        arrivals.append((index / stage.rate, Request(f"r{index}", max_tokens=stage.output_tokens,
                                                     prompt_token_ids=prompt)))
    result = simulate(engine, arrivals)
    host = host_of(cost)
    frontend_ms = host.frontend_s(stage.system_tokens + stage.question_tokens) * 1000
    done = [o for o in result.outcomes.values() if o.finished and o.ttft is not None]
    ttft = statistics.fmean(o.ttft for o in done) * 1000 + frontend_ms
    e2e = statistics.fmean(o.finish - o.arrival for o in done) * 1000 + frontend_ms \
        + host.frontend_finish_ms
    return ttft, (e2e - ttft) / (stage.output_tokens - 1)


def _err(predicted: float, measured: float) -> str:
    return f"{predicted:.1f} ({(predicted - measured) / measured:+.0%})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="h100:llama-3.1-8b@vllm-0.13")
    parser.add_argument("--newer", default="h100:llama-3.1-8b",
                        help="the other engine printed beside it (default: vLLM 0.24)")
    parser.add_argument("--seconds", type=float, default=120.0,
                        help="simulated seconds per stage (the stages ran 600-1,200 s; the "
                        "queue settles within seconds at these loads)")
    args = parser.parse_args(argv)
    cost = load_cost(args.preset)
    if not isinstance(cost, HostedCost):
        raise SystemExit(f"{args.preset}: a kernels + host preset is needed (not :kernels)")
    asynchronous = replace(cost, host=replace(cost.host, async_scheduling=True))
    newer = load_cost(args.newer)
    kernels = load_cost(f"{args.preset.partition('@')[0]}:kernels")
    print(f"source: {public.SIM_TO_REAL_STAGES_SOURCE}")
    print(f"preset = {cost.name}, async = the same with async scheduling, newer = {newer.name}")
    models = "preset (err) | async (err) | newer (err) | kernels only (err)"
    print(f"| exp | workload | budget | req/s | TTFT mean measured | {models} "
          f"| TPOT measured | {models} |")
    print("|" + "---|" * 14)
    errors: dict[str, list[float]] = {}
    for stage in public.SIM_TO_REAL_STAGES:
        cells = []
        for name, model in (("preset", cost), ("async", asynchronous), ("newer", newer)):
            ttft, tpot = predict(stage, model, args.seconds)
            cells.append((name, ttft, tpot))
        ttft, tpot = predict(stage, kernels, args.seconds)
        cells.append(("kernels", ttft, tpot))
        for name, ttft, tpot in cells:
            errors.setdefault(f"{name} TTFT", []).append(
                abs(ttft - stage.ttft_mean_ms) / stage.ttft_mean_ms)
            errors.setdefault(f"{name} TPOT", []).append(
                abs(tpot - stage.tpot_mean_ms) / stage.tpot_mean_ms)
        print(f"| {stage.experiment} | {stage.workload} | {stage.max_num_batched_tokens} | "
              f"{stage.rate:g} | {stage.ttft_mean_ms:.1f} | "
              + " | ".join(_err(ttft, stage.ttft_mean_ms) for _, ttft, _ in cells)
              + f" | {stage.tpot_mean_ms:.2f} | "
              + " | ".join(_err(tpot, stage.tpot_mean_ms) for _, _, tpot in cells) + " |")
    for key, values in errors.items():
        print(f"{key}: median |error| {statistics.median(values):.0%} over {len(values)} stages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
