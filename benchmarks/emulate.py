"""How far one process of emulated nodes keeps up with real time, across the paper's QPS range.

    python -m benchmarks.emulate [--layout 1P3D] [--emulate h100] [--qps 0.5,1,2,4,8,12,16,20]
                                 [--duration 10] [--workload small-mid_bal]

Starts `ppd cluster up --emulate` (all nodes in one process) and `ppd proxy --policy local` in
front, then replays two-turn synthetic conversations (Poisson arrivals, `--qps` conversations
per second as in the paper, so requests/s is twice that) for `--duration` s per point. Per
point, from the nodes' own counters (ppd:emulator_*): steps run, tokens delivered, how late
steps were delivered after their modelled end (mean, share later than 5 ms, worst so far), and
the emulator process's CPU use; from the client: success and turn-2 TTFT.

With `--routes`, each point is replayed twice with turn 2 forced P->D and forced local (the
proxy's x-ppd-route header), to compare with the paper's turn-2 TTFT (see
docs/emulated-nodes.md).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from profiler.cluster.emulated import start_emulated_cluster
from profiler.cluster.launcher import Cluster
from profiler.cluster.plan import ClusterConfig, parse_layout
from profiler.replay.client import ReplayConfig, replay
from profiler.traces.synthetic import named_workload
from proxy.policies import local as local_policy
from proxy.shared.tokens import token_counter
from proxy.shared.vocabulary import RouteKind

ADMIN_KEY = "bench-admin"  # forcing a route needs the proxy's admin key

PAPER_QPS = (0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 20.0)
COUNTERS = ("ppd:emulator_steps_total", "ppd:emulator_late_steps_total",
            "ppd:emulator_lag_seconds_total", "ppd:emulator_tokens_total",
            "ppd:emulator_busy_seconds_total")  # fmt: skip
MAX_LAG = "ppd:emulator_max_lag_seconds"


def node_counters(urls: list[str]) -> dict[str, float]:
    """COUNTERS summed over the nodes, MAX_LAG as the worst node's."""
    out = dict.fromkeys((*COUNTERS, MAX_LAG), 0.0)
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in COUNTERS:
                    out[sample.name] += sample.value
                elif sample.name == MAX_LAG:
                    out[MAX_LAG] = max(out[MAX_LAG], sample.value)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Point:
    qps: float
    route: str
    conversations: int
    success: float
    turn2_ttft_ms: float | None
    turn2_tpot_ms: float | None
    steps_s: float
    tokens_s: float
    mean_lag_ms: float
    late_share: float
    max_lag_ms: float
    cpu_share: float


def run_point(cluster: Cluster, qps: float, duration: float, workload: str, route: str,
              tokenizer: object, seed: int) -> Point:
    urls = [node.url for node in cluster.nodes]
    pid = cluster.nodes[0].proc.pid
    count = max(1, math.ceil(qps * duration * 1.5))
    conversations = named_workload(workload, count, seed=seed, tokenizer=tokenizer)  # type: ignore[arg-type]
    headers: Mapping[str, str] = ({} if route == "auto" else
                                  {"x-ppd-route": route, "authorization": f"Bearer {ADMIN_KEY}"})
    config = ReplayConfig(target=cluster.proxy_url, qps=qps, duration_s=duration, max_turns=2,
                          timeout_s=30.0, seed=seed,
                          headers_for_turn=lambda turn: headers if turn >= 2 else {})
    before, cpu0 = node_counters(urls), cpu_seconds(pid)
    result = asyncio.run(replay(conversations, config))
    after, cpu1 = node_counters(urls), cpu_seconds(pid)
    grew = {name: after[name] - before[name] for name in COUNTERS}
    wall = result.wall_time_s
    ok = [r for r in result.records if r.success]
    turn2 = [r for r in ok if r.turn >= 2]
    steps = grew["ppd:emulator_steps_total"]
    return Point(
        qps=qps, route=route, conversations=result.n_conversations,
        success=len(ok) / max(len(result.records), 1),
        turn2_ttft_ms=_median([r.ttft_s for r in turn2]),
        turn2_tpot_ms=_median([r.tpot_s for r in turn2]),
        steps_s=steps / wall, tokens_s=grew["ppd:emulator_tokens_total"] / wall,
        mean_lag_ms=1000 * grew["ppd:emulator_lag_seconds_total"] / max(steps, 1),
        late_share=grew["ppd:emulator_late_steps_total"] / max(steps, 1),
        max_lag_ms=1000 * after[MAX_LAG], cpu_share=(cpu1 - cpu0) / wall,
    )  # fmt: skip


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return 1000 * statistics.median(present) if present else None


def render(points: list[Point]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    header = (f"{'conv/s':>6} {'route':>5} {'conv':>5} {'ok':>5} {'T2 TTFT':>8} {'T2 TPOT':>8} "
              f"{'steps/s':>8} {'tok/s':>7} {'lag ms':>7} {'late':>6} {'max lag':>8} {'CPU':>5}")
    lines = [header, "-" * len(header)]
    for p in points:
        lines.append(
            f"{p.qps:>6g} {p.route:>5} {p.conversations:>5} {p.success:>5.0%} "
            f"{ms(p.turn2_ttft_ms):>8} {ms(p.turn2_tpot_ms):>8} {p.steps_s:>8.0f} "
            f"{p.tokens_s:>7.0f} {p.mean_lag_ms:>7.2f} {p.late_share:>6.1%} "
            f"{p.max_lag_ms:>8.1f} {p.cpu_share:>5.0%}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.emulate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", default="1P3D")
    parser.add_argument("--emulate", default="h100")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--qps", default=",".join(f"{q:g}" for q in PAPER_QPS))
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--workload", default="small-mid_bal")
    parser.add_argument("--routes", action="store_true",
                        help="force turn 2 P->D, then local, at each point")
    parser.add_argument("--base-port", type=int, default=18500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    qps_points = [float(q) for q in args.qps.split(",") if q.strip()]
    routes = [RouteKind.PD.value, RouteKind.LOCAL.value] if args.routes else ["auto"]
    with tempfile.TemporaryDirectory(prefix="ppd-bench-emulate-") as state:
        config = ClusterConfig(model=args.model, layout=parse_layout(args.layout),
                               state_dir=Path(state), base_port=args.base_port)
        with start_emulated_cluster(config, args.emulate) as cluster:
            cluster.start_proxy(local_policy.NAME, port=args.base_port + 90,
                                extra_args=["--admin-key", ADMIN_KEY])
            tokenizer = token_counter(cluster.model_path)
            print(f"emulated {args.layout} {args.emulate}:{args.model}, one process "
                  f"(pid {cluster.nodes[0].proc.pid}); proxy policy local; workload "
                  f"{args.workload}, {args.duration:g} s per point; {os.cpu_count()} cores")
            points = []
            for qps in qps_points:
                for route in routes:
                    points.append(run_point(cluster, qps, args.duration, args.workload, route,
                                            tokenizer, args.seed))
                    print(render(points[-1:]).splitlines()[-1], flush=True)
    print()
    print(render(points))
    return 0


if __name__ == "__main__":
    sys.exit(main())
