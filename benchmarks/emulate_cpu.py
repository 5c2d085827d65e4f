"""Emulated nodes against the real vLLM-CPU cluster: the same replay on both.

    python -m benchmarks.emulate_cpu [--qps 0.2] [--duration 60] [--out runs/emulate-cpu]
                                     [--connector nixl|shared-storage]

1. a real 1P1D vLLM-CPU cluster (the tiny model) moving KV with vLLM's production transport,
   NixlConnector over UCX/TCP (`--connector shared-storage`: ExampleConnector's files), behind
   `ppd proxy --policy fixed --x 0.5`, so turn 2 goes P->D in about half the conversations
   and local in the others;
2. `ppd sim fit` on that run -> a LinearCost preset (OUT/cpu-tiny.json), and the fixed part
   of a P->D turn 1 (the fit's TTFT intercept: the P leg's round trip, D's NIXL pull and both
   nodes' request overhead) as the link's latency;
3. an emulated 1P1D cluster timed by that preset and link, behind the same proxy policy, the
   same conversations (same seed: same routes per conversation);
4. per route, turn-2 TTFT and TPOT (median and mean) of both runs and the emulation's error.
The fit is made on the run it is compared with (in-sample): it shows how well the engine
model's structure (steps, prefix cache, P->D hand-off) reproduces the measurements once its
costs are set, not how well it extrapolates. Costs CPU: run it alone, once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from profiler.cluster.emulated import start_emulated_cluster
from profiler.cluster.launcher import Cluster, default_cores, start_cluster
from profiler.cluster.plan import ClusterConfig, Connector, parse_layout
from profiler.emulate.label import emulated_backend
from profiler.engine.fit import fit, read_runs, write_preset
from profiler.models.prepare import prepare_model
from profiler.replay.client import ReplayConfig, ReplayResult, replay
from profiler.replay.metrics import summarize
from profiler.replay.output import write_run
from profiler.traces.synthetic import named_workload
from proxy.policies import fixed as fixed_policy
from proxy.shared.tokens import token_counter
from proxy.shared.vocabulary import RouteKind

WORKLOAD = "mixed"


def run(cluster: Cluster, args: argparse.Namespace, out: Path, backend: str | None
        ) -> ReplayResult:
    cluster.start_proxy(fixed_policy.NAME, port=args.base_port + 90, extra_args=["--x", "0.5"])
    tokenizer = token_counter(args.tokenizer)
    count = int(args.qps * args.duration * 1.5) + 2
    conversations = named_workload(WORKLOAD, count, seed=args.seed, tokenizer=tokenizer)
    config = ReplayConfig(target=cluster.proxy_url, qps=args.qps, duration_s=args.duration,
                          max_turns=2, timeout_s=60.0, seed=args.seed,
                          max_tokens_cap=args.max_tokens_cap)
    result = asyncio.run(replay(conversations, config))
    summary = summarize(result.records, result.wall_time_s)
    write_run(out, result, summary, label=out.name, dataset=f"synthetic:{WORKLOAD}",
              backend=backend)
    return result


def per_route(run_dir: Path) -> dict[str, dict[str, float]]:
    """Turn-2 TTFT and TPOT (ms) per route, from a run's requests.parquet."""
    import pandas as pd

    frame = pd.read_parquet(run_dir / "requests.parquet")
    for name in ("ttft", "tpot"):  # runs written before the columns moved to ms
        if f"{name}_ms" not in frame and f"{name}_s" in frame:
            frame[f"{name}_ms"] = frame[f"{name}_s"] * 1000
    out: dict[str, dict[str, float]] = {}
    for route in (RouteKind.PD.value, RouteKind.LOCAL.value):
        rows = frame[frame["success"].astype(bool) & (frame["turn"] == 2)
                     & (frame["route"] == route)]
        ttft, tpot = rows["ttft_ms"].dropna(), rows["tpot_ms"].dropna()
        if len(ttft) and len(tpot):
            out[route] = {"n": len(rows), "ttft_p50": float(ttft.median()),
                          "ttft_mean": float(ttft.mean()), "tpot_p50": float(tpot.median()),
                          "tpot_mean": float(tpot.mean())}
    return out


def render(real: dict[str, dict[str, float]], emulated: dict[str, dict[str, float]]) -> str:
    lines = [f"{'route':<6} {'metric':<10} {'real ms':>9} {'emulated ms':>12} {'error':>7}  n",
             "-" * 50]
    for route in (RouteKind.PD.value, RouteKind.LOCAL.value):
        if route not in real or route not in emulated:
            lines.append(f"{route:<6} (no successful turn 2 on both)")
            continue
        for metric in ("ttft_p50", "ttft_mean", "tpot_p50", "tpot_mean"):
            a, b = real[route][metric], emulated[route][metric]
            lines.append(f"{route:<6} {metric:<10} {a:>9.1f} {b:>12.1f} {(b - a) / a:>+7.0%}  "
                         f"{real[route]['n']:.0f}/{emulated[route]['n']:.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.emulate_cpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qps", type=float, default=0.2, help="conversations per second")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--max-tokens-cap", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-port", type=int, default=18600)
    parser.add_argument("--connector", type=Connector, choices=list(Connector),
                        default=Connector.NIXL, help="the real cluster's KV transfer")
    parser.add_argument("--out", type=Path, default=Path("runs/emulate-cpu"))
    parser.add_argument("--reuse-real", action="store_true",
                        help="compare with OUT/real from an earlier run (no vLLM this time)")
    args = parser.parse_args(argv)
    model = prepare_model("tiny")
    args.tokenizer = model
    layout = parse_layout("1P1D")
    if not (args.reuse_real and (args.out / "real" / "requests.parquet").is_file()):
        real_config = ClusterConfig(model=str(model), layout=layout,
                                    state_dir=args.out / "real-state", base_port=args.base_port,
                                    connector=args.connector, cores=default_cores(),
                                    startup_timeout_s=600)
        with start_cluster(real_config, progress=print) as cluster:
            run(cluster, args, args.out / "real", None)
    preset = args.out / "cpu-tiny.json"
    fitted = fit(read_runs([args.out / "real"]), name="cpu-tiny",
                 source=f"ppd sim fit on {args.out / 'real'}")
    write_preset(fitted, preset)
    link = f"{fitted.ttft_intercept_ms:.1f}:3.125"
    cost = fitted.cost
    print(f"fitted: step = {cost.base_ms:.2f} ms + {cost.per_prefill_token_ms:.4f} ms/prompt "
          f"token + {cost.per_decode_seq_ms:.3f} ms/decoding request; link {link} (ms:GB/s)")
    emulated_config = ClusterConfig(model="tiny", layout=layout,
                                    state_dir=args.out / "emulated-state",
                                    base_port=args.base_port + 10)
    with start_emulated_cluster(emulated_config, str(preset.resolve()), link,
                                progress=print) as cluster:
        run(cluster, args, args.out / "emulated", emulated_backend(f"{preset.name} (fitted)"))
    print(render(per_route(args.out / "real"), per_route(args.out / "emulated")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
