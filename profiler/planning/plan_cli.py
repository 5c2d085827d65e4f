"""`ppd sim plan`: which layout and policy for N GPUs, a model and a traffic, and what TTFT and
TPOT they give.

    ppd sim plan --gpus 8 --cost h100:llama-3.1-8b --dataset sharegpt --conversation-rate 3

It searches the layouts the GPUs fit (`plan_space`) under the policies that apply
(`plan_search`), scores every run against the SLO (`slo`), and prints the candidates ranked
with one recommendation (`plan_rank`); plan.csv (every run), ranked.csv and plan.png go to
--out. docs/planning.md has an example output.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.flags.types import positive_int
from profiler.simulator.flags import (
    add_cluster_flags,
    add_trace_window_flags,
    load_of,
    readback_ttl,
)

TARGET_CONVERSATIONS = 150  # the default duration's aim: above plan_rank.MIN_CONVERSATIONS
TIMED_DURATION_S = 120.0  # a timed trace's default window
DEFAULT_SEEDS = 2
DEFAULT_POLICIES = "pd,local,live,ppd"  # plan_space.DEFAULT_POLICIES (not imported: startup)

if TYPE_CHECKING:  # the simulator is imported once the flags are parsed
    from profiler.planning.plan_space import Space
    from profiler.simulator.run import RunSpec
    from profiler.simulator.slo import Slo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppd sim plan",
        description="Search the layouts N GPUs fit and the routing policies that apply, on a "
        "simulated cluster, and rank them by SLO attainment for a traffic (docs/planning.md).")
    parser.add_argument("--gpus", type=positive_int, required=True,
                        help="GPUs of the cluster (1-64); each instance takes the preset's tpN")
    parser.add_argument("--dataset", required=True,
                        help="synthetic:NAME, sharegpt, or a trace file (as `ppd sim run`)")
    rate = parser.add_mutually_exclusive_group(required=True)
    rate.add_argument("--conversation-rate", dest="qps", type=float, metavar="R",
                      help="new conversations per second, for the whole cluster")
    add_trace_window_flags(parser, rate)
    parser.add_argument("--duration", type=float,
                        help="seconds during which conversations start (default: enough for "
                        f"about {TARGET_CONVERSATIONS} conversations per run; a timed trace: "
                        f"{TIMED_DURATION_S:g} s of it)")
    parser.add_argument("--seeds", type=positive_int, default=DEFAULT_SEEDS,
                        help=f"seeds (draws of conversations and arrivals) the best candidates "
                        f"run on, to tell them apart (default {DEFAULT_SEEDS}; --seed is the "
                        "first)")
    parser.add_argument("--policies", default=DEFAULT_POLICIES,
                        help=f"comma list of policy labels (default {DEFAULT_POLICIES}; replica "
                        "is added on replicas-alone layouts)")
    parser.add_argument("--max-turns", type=positive_int, help="at most N turns per conversation")
    parser.add_argument("--slo-ttft-floor", type=float, default=0.5, metavar="S",
                        help="SLO: a turn's TTFT may always take S seconds (default 0.5)")
    parser.add_argument("--slo-ttft-factor", type=float, default=3.0, metavar="K",
                        help="SLO: or K x its TTFT alone on an idle cluster (default 3)")
    parser.add_argument("--slo-tpot", type=float, default=50.0, metavar="MS",
                        help="SLO: TPOT at most MS milliseconds (default 50)")
    add_cluster_flags(parser)
    parser.add_argument("--table-dir", type=Path, default=Path("tables"),
                        help="shipped decision tables for ppd (default tables/); a layout "
                        "without one gets a table built from the traffic's cells")
    parser.add_argument("--processes", type=positive_int, default=os.cpu_count() or 1,
                        help="worker processes (default: one per core)")
    parser.add_argument("--out", type=Path, help="output directory (default runs/plan-UTCTIME)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from profiler.planning.plan_space import plan_space
    from profiler.simulator.slo import Slo

    space = plan_space(args.gpus, args.cost)
    slo = Slo(args.slo_ttft_floor, args.slo_ttft_factor, args.slo_tpot)
    policies = tuple(part.strip() for part in args.policies.split(",") if part.strip())
    if not policies:
        raise ValueError("--policies names nothing: give a comma list, e.g. pd,live")
    base = _base_spec(args, space.slices)
    out = args.out or Path("runs") / f"plan-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    seeds = tuple(range(args.seed, args.seed + args.seeds))
    print(_header(args, space, base, seeds))
    print(f"SLO: {slo.describe()}")
    for note in space.notes:
        print(f"search: {note}")
    return _search(args, space, base, slo, policies, seeds, out)


def _search(args: argparse.Namespace, space: Space, base: RunSpec, slo: Slo,
            policies: tuple[str, ...], seeds: tuple[int, ...], out: Path) -> int:
    import pandas as pd

    from profiler.planning.plan_plot import plot_plan
    from profiler.planning.plan_rank import rank, recommendation, table_text, warnings
    from profiler.planning.plan_search import PlanSearch
    from profiler.simulator.slo import IDLE_LAYOUT

    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with PlanSearch(base, space, policies=policies, seeds=seeds, slo=slo,
                    processes=args.processes, table_dir=args.table_dir,
                    work_dir=out / "tables", say=print) as search:
        started_reference = time.perf_counter()
        search.references()
        print(f"SLO reference: each conversation alone on an idle {IDLE_LAYOUT}, routes pd "
              f"and local, {len(seeds)} seed(s): {time.perf_counter() - started_reference:.0f} s",
              flush=True)
        screened = search.screen_candidates()
        search.pilot(screened[0])
        runs, eta = search.estimate_s(len(screened))
        print(f"search: {len(screened)} candidates to screen, at most {runs} runs in all; "
              f"about {_duration(eta)} more with {args.processes} process(es) (one run took "
              f"{search.pilot_s:.1f} s)", flush=True)
        search.screen(screened[1:])
        search.widen()
        search.confirm()
    rows = pd.DataFrame(search.rows)
    rows.to_csv(out / "plan.csv", index=False)
    ranked = rank(rows)
    ranked.to_csv(out / "ranked.csv", index=False)
    plot_plan(ranked, out / "plan.png", title=f"ppd sim plan: {args.gpus} GPUs, {args.cost}, "
              f"{args.dataset}")
    print(table_text(ranked))
    print(recommendation(ranked))
    for warning in warnings(ranked, rows):
        print(f"ppd sim plan: warning: {warning}", file=sys.stderr)
    print(f"searched {len(rows)} runs in {time.perf_counter() - started:.0f} s; "
          f"{out}/plan.csv, ranked.csv, plan.png")
    return 0


def _base_spec(args: argparse.Namespace, slices: int) -> RunSpec:
    from profiler.simulator.run import RunSpec
    from proxy.config.policy_config import Policy, PolicyConfig

    load = load_of(args)  # a conversation rate, or a timed trace's time scale
    if not (math.isfinite(load) and load > 0):
        flag = "--time-scale" if args.time_scale is not None else "--conversation-rate"
        raise ValueError(f"{flag} must be a finite number > 0 (got {load:g})")
    slice_rate = load / slices  # a slice takes 1/slices of the traffic
    if args.duration is not None:
        duration = args.duration
    elif args.time_scale is not None:
        duration = TIMED_DURATION_S
    else:
        duration = max(10.0, math.ceil(TARGET_CONVERSATIONS / slice_rate))
    spec = RunSpec(layout="1P1D", dataset=args.dataset, qps=slice_rate,
                   policy=PolicyConfig(kind=Policy.PD), cost=args.cost, model=args.model,
                   link=args.link, duration_s=duration, timeout_s=args.timeout,
                   seed=args.seed, max_turns=args.max_turns, load_window_s=args.load_window,
                   client_connections=args.client_connections,
                   reply_retokenized=args.reply_retokenized, client=args.client,
                   kv_readback_ttl_s=readback_ttl(args), fresh_arrivals=args.fresh_arrivals,
                   start_s=args.start)
    return spec


def _header(args: argparse.Namespace, space: Space, base: RunSpec, seeds: tuple[int, ...]
            ) -> str:
    rate = (f"{args.qps:g} conversations/s" if args.time_scale is None
            else f"time-scale {args.time_scale:g}")
    return (f"ppd sim plan: {args.gpus} GPUs, {args.cost} -> {space.instances} instances "
            f"of tp{space.tp}; {args.dataset} at {rate}, conversations starting for "
            f"{base.duration_s:g} s; seeds {', '.join(map(str, seeds))}")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
