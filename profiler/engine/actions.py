"""What the engine model's `ppd sim` commands do: presets, step, idle, fit and calibrate.

Their flags are declared with every other `ppd sim` command in `profiler.simulator.cli`,
the one `ppd sim` command module; these functions take the parsed flags and return the text
to print.

    ppd sim presets
    ppd sim step --preset h100:llama-3.1-8b --decode 32 --context 2048 --prefill 256
    ppd sim fit runs/replica-cpu --out tables/cost/cpu-tiny.json
    ppd sim calibrate runs/cpu/*@1-local runs/cpu/*@1-pd --out cpu-tiny.json
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.engine.batch import BatchShape
from profiler.engine.config import EngineConfig
from profiler.engine.cost import LinearCost
from profiler.engine.host import HostedCost
from profiler.engine.presets import load_cost
from profiler.engine.transfer import LINKS, MODEL_SHAPES

if TYPE_CHECKING:
    from profiler.engine.calibrate import Calibration
    from proxy.shared.vocabulary import RouteKind

# A replay run simulated again on a preset: (run, preset, KV model, replies retokenized,
# route) -> median real minus simulated TTFT of that route's turns 2+ in ms, or None.
# `profiler.simulator.replay_twin.twin_ttft_gap_ms`, handed in by `ppd sim` (the simulator
# stands above the engine model).
TwinGap = Callable[[Path, str, str, bool, "RouteKind"], "float | None"]


def render_idle(args: argparse.Namespace) -> tuple[str, str | None]:
    """`ppd sim idle`: the prediction's line, and a note on it (None: nothing to say)."""
    from profiler.engine.idle import IdleShape, predict

    shape = IdleShape(prompt=args.prompt, cached=args.cached, decoding=args.decoding,
                      context=args.context, max_tokens=args.max_tokens)
    prediction = predict(load_cost(args.preset), shape)
    return prediction.line(), prediction.warning(shape)


def render_presets() -> str:
    from profiler.engine import presets
    from profiler.engine.vllm_versions import DEFAULT_VERSION, VERSION_MARK, VERSIONS

    lines = ["cost presets: GPU:MODEL[:tpN][@vllm-X.Y] = aiconfigurator-core's measured vLLM "
             "0.24.0 kernels + one vLLM release's host side; :kernels = the kernels alone",
             "", "vLLM host sides (@vllm-X.Y; the default is "
             f"{DEFAULT_VERSION}):"]
    for version in VERSIONS.values():
        mark = " (default)" if version.version == DEFAULT_VERSION else ""
        lines += [f"  {VERSION_MARK}{version.version}{mark}: {version.what}",
                  f"      sources: {version.sources}"]
    lines += ["", "presets:"]
    names = presets.preset_names()
    width = max(len(name) for name in names)
    for name in names:
        if name.endswith(f":{presets.KERNELS_SUFFIX}"):
            what = "kernels only (no host side)"
        elif VERSION_MARK in name:
            what = f"vLLM {name.partition(VERSION_MARK)[2]}"
        elif name.split(":")[0] in ("h100", "h200", "b200"):
            what = f"vLLM {DEFAULT_VERSION}"
        else:
            what = "registered"
        lines.append(f"  {name:<{width}}  {what}")
    lines += ["  FILE.json  (a LinearCost from `ppd sim fit`, or kernels + host from "
              "`ppd sim calibrate`)", "",
              "KV model shapes (bytes per token):"]
    lines += [f"  {s.name:<14} {s.kv_bytes_per_token:>8}  {s.source}"
              for s in MODEL_SHAPES.values()]
    lines += ["", "links:"]
    lines += [f"  {link.name:<10} {link.bandwidth_bytes_per_s / 1e9:>6.1f} GB/s "
              f"{link.latency_s * 1e6:>5.0f} us  {link.source}" for link in LINKS.values()]
    return "\n".join(lines)


def render_step(args: argparse.Namespace) -> str:
    for name in ("decode", "context", "prefill", "prefill_context"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
    if args.decode and not args.context:
        raise ValueError("--decode needs --context (each decoding request's context)")
    if not args.decode and not args.prefill:
        raise ValueError("an empty step: give --decode and/or --prefill")
    # one step of one engine: at most max_num_seqs requests, each within max_model_len (a
    # 10^8 x 10^8 step overflowed aiconfigurator's 32-bit token counts)
    limits = EngineConfig()
    if args.decode > limits.max_num_seqs:
        raise ValueError(f"--decode {args.decode}: one step runs at most max_num_seqs "
                         f"{limits.max_num_seqs} requests")
    for name in ("context", "prefill", "prefill_context"):
        if getattr(args, name) > limits.max_model_len:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)} exceeds "
                             f"max_model_len {limits.max_model_len}")
    shape = BatchShape(num_prefill_requests=1 if args.prefill else 0,
                       sum_prefill_tokens=args.prefill,
                       sum_prefill_kv_tokens=args.prefill_context if args.prefill else 0,
                       num_decode_requests=args.decode,
                       sum_decode_kv_tokens=args.decode * args.context)
    cost = load_cost(args.preset)
    step_ms = cost.step_ms(shape)
    split = ""
    if isinstance(cost, HostedCost):
        kernel_ms = cost.kernel.step_ms(cost.host.graph_shape(shape))
        split = f" (kernels {kernel_ms:.2f} ms + host {step_ms - kernel_ms:.2f} ms)"
    parts = []
    if args.decode:
        parts.append(f"{args.decode} decoding at {args.context} context")
    if args.prefill:
        cached = f" after {args.prefill_context} cached" if args.prefill_context else ""
        parts.append(f"{args.prefill} prompt tokens{cached}")
    return (f"{cost.name}: {' + '.join(parts)}: {step_ms:.2f} ms per step{split}\n"
            f"source: {cost.source}")


def run_fit(runs: list[Path], out: Path, name: str) -> str:
    from profiler.engine.fit import fit, read_runs, write_preset

    source = "ppd sim fit on " + ", ".join(str(run) for run in runs)
    result = fit(read_runs(runs), name=name, source=source)
    write_preset(result, out)
    cost = result.cost
    unqueued = "unqueued " if result.prefill_rows_unqueued else ""
    return (f"wrote {out}\n"
            f"  step = {cost.base_ms:.2f} ms + {cost.per_prefill_token_ms:.4f} ms/prompt token "
            f"+ {cost.per_decode_seq_ms:.3f} ms/decoding request\n"
            f"  prefill fit on {result.n_prefill_rows} {unqueued}turn-1 rows (TTFT intercept "
            f"{result.ttft_intercept_ms:.1f} ms, not in the step cost); decode fit on "
            f"{result.n_decode_rows} rows")


VLLM_CPU_SERVER_TOKEN_BUDGET = 2048


def run_calibrate(args: argparse.Namespace, twin_gap: TwinGap) -> str:
    from profiler.engine.calibrate import calibrate, read_probe

    if args.block_size < 1 or args.max_model_len < 1:
        raise ValueError("--block-size and --max-model-len must be at least 1")
    whole_prompt = args.connector == "shared-storage"
    # vLLM-CPU's API-server default token budget per step (vllm/engine/arg_utils.py, CPU
    # branch of the default max_num_batched_tokens, 0.32), when chunked prefill is on.
    budget = args.max_model_len if whole_prompt else min(VLLM_CPU_SERVER_TOKEN_BUDGET,
                                                         args.max_model_len)
    # read and checked before the runs are, so a bad probe fails before any work
    probe = read_probe(args.probe) if args.probe is not None else None
    result = calibrate(args.runs, name=args.name or args.out.stem, block_size=args.block_size,
                       engine={"max_model_len": args.max_model_len,
                               "max_num_batched_tokens": budget},
                       whole_prompt_transfer=whole_prompt, probe=probe)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    _write_preset(args.out, result.cost)
    cost, settled = _settle_on_runs(args, result, twin_gap)
    host = cost.host
    kernel = cost.kernel
    assert isinstance(kernel, LinearCost)
    return (f"wrote {args.out} from {result.n_runs} runs\n"
            f"  step = {host.step_base_ms:.2f} ms + {kernel.per_decode_seq_ms:.3f} ms/decoding "
            f"request + ({host.step_per_prefill_ms:.2f} ms + "
            f"{kernel.per_prefill_token_ms:.4f} ms/token + "
            f"{kernel.per_prefill_attention_ms:.4f} ms/token per 1k context) per prompt\n"
            f"  front end {host.frontend_request_ms:.1f} ms + {host.frontend_per_token_us:.2f} "
            f"us/prompt token + {host.frontend_per_running_ms:.2f} ms/running request per "
            f"node request ({result.frontend_rows} rows); P->D hand-off "
            f"{host.kv_handoff_ms:.1f} ms + "
            f"{host.kv_per_token_us:.1f} us/token ({result.handoff_rows} rows)\n"
            f"  fitted on {result.prefill_points} prefill and {result.decode_points} decode "
            "node-runs" + _reply_line(result) + settled)


def _write_preset(path: Path, cost: HostedCost) -> None:
    import json

    from profiler.engine.presets import to_dict

    path.write_text(json.dumps(to_dict(cost), indent=2) + "\n")


def _settle_on_runs(args: argparse.Namespace, result: Calibration,
                    twin_gap: TwinGap) -> tuple[HostedCost, str]:
    """Second pass: simulate every run on the written preset and move first the front end by
    the median gap between real and simulated local turn-2 TTFT, then the P->D hand-off by
    that of P->D TTFT. Both are then measured against the engine model's own dynamics (its
    step alignment, the batch a request meets as it arrives) rather than the algebra of the
    first pass."""
    from dataclasses import replace

    from proxy.shared.vocabulary import RouteKind

    cost, lines = result.cost, ""
    for route, term, label in ((RouteKind.LOCAL, "frontend_request_ms", "front end"),
                               (RouteKind.PD, "kv_handoff_ms", "P->D hand-off")):
        gap, count = _median_gap(args, result, route, twin_gap)
        if gap is None:
            continue
        host = cost.host
        value = round(max(getattr(host, term) + gap, 0.0), 3)
        sources = {**host.sources, term: f"{host.sources.get(term, '')}, then moved by the "
                   f"median {route.value} TTFT gap of {count} simulated runs"}
        cost = replace(cost, host=replace(host, **{term: value}, sources=sources))
        _write_preset(args.out, cost)
        lines += (f"\n  {label} settled on the simulated runs: {gap:+.1f} ms (median gap "
                  f"over {count} runs) -> {value:.1f} ms")
    return cost, lines


def _median_gap(args: argparse.Namespace, result: Calibration, route: RouteKind,
                twin_gap: TwinGap) -> tuple[float | None, int]:
    """Median over the runs of (real - simulated) TTFT on `route`, on the preset as written."""
    gaps = []
    for run in args.runs:
        if not (run / "summary.json").is_file():
            continue  # not a `ppd replay` directory: nothing to simulate it again from
        gap = twin_gap(run, str(args.out), args.model, result.reply_retokenized, route)
        if gap is not None:
            gaps.append(gap)
    if not gaps:
        return None, 0
    gaps.sort()
    return gaps[len(gaps) // 2], len(gaps)


def _reply_line(result: Calibration) -> str:
    share = result.reply_hit_share
    if share is None:
        return ""
    hint = (": replies come back as other token ids; simulate with --reply-retokenized"
            if result.reply_retokenized else "")
    return (f"\n  turn 2 found {share:.0%} of turn 1's reply in D's prefix cache "
            f"(D's counters){hint}")
