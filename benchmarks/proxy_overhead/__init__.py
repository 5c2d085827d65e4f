"""Proxy overhead: requests/s, TTFT and CPU through ppd against talking to a fake vLLM directly.

    python -m benchmarks --only proxy_overhead [--quick] [--stack default --stack ...]

Processes share the machine: a zero-compute fake vLLM (`backend`), the proxies (one per
target, `proxy_process`; the vLLM project's Rust router as a peer, `peers`) and a closed-loop
load generator (`loadgen`); `runner` drives them, rows interleaved over the targets, and
`report` prints the table and writes the JSON. Ratios to `direct` in the same run are what to
read: absolute numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.proxy_overhead import peers, report, runner
from benchmarks.proxy_overhead.proxy_process import STACKS
from proxy.policies import local as local_policy

RESULTS = Path(__file__).resolve().parents[1] / "results"
# One proxy (policy local runs turn 1 as P->D and later turns locally: both routes), short rows.
QUICK = runner.Plan(targets=("direct", local_policy.NAME), concurrency=(1, 16), turns=(1, 4),
                    duration=0.3, warmup=0.1, long_factor=10, long_concurrency=16)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    group = parser.add_argument_group("proxy_overhead")
    group.add_argument("--quick", action="store_true",
                       help="a few short rows (a smoke test, not a measurement)")
    group.add_argument("--stack", action="append", choices=(*STACKS, "baseline"),
                       help="proxy stacks to compare side by side (repeatable)")
    group.add_argument("--baseline", type=Path, metavar="TREE",
                       help="another ppd checkout, measured as stack `baseline`")
    group.add_argument("--target", action="append",
                       choices=("direct", *runner.POLICIES, *peers.PEERS),
                       help="targets to measure (repeatable; default all)")
    group.add_argument("--rounds", type=int,
                       help="measure each row this many times, interleaved (default 1)")
    group.add_argument("--duration", type=float, help="seconds measured per row")
    group.add_argument("--concurrency", type=int, action="append",
                       help="concurrency levels (repeatable)")
    group.add_argument("--long-factor", type=int,
                       help="the RSS run's length in rows (default 10; 0: no RSS run)")
    group.add_argument("--out", type=Path, help="JSON file (default benchmarks/results/...)")


def run(args: argparse.Namespace, command: str) -> int:
    """Run the benchmark; print the table; write the JSON. Exit status 1 on any error."""
    plan = QUICK if args.quick else runner.Plan()
    if args.stack:
        plan = replace(plan, stacks=tuple(args.stack))
    if args.target:
        plan = replace(plan, targets=tuple(args.target))
    if args.baseline:
        plan = replace(plan, baseline=args.baseline.resolve())
        if not args.stack:
            plan = replace(plan, stacks=("baseline", *plan.stacks))
    if args.duration:
        plan = replace(plan, duration=args.duration)
    if args.concurrency:
        plan = replace(plan, concurrency=tuple(args.concurrency))
    if args.rounds:
        plan = replace(plan, rounds=args.rounds)
    if args.long_factor is not None:
        plan = replace(plan, long_factor=args.long_factor)
    print(f"proxy overhead - {report.machine()}", flush=True)
    rows = runner.run(plan, progress=sys.stderr)
    print(report.render(rows))
    if "baseline" in plan.stacks and "default" in plan.stacks:
        print("\nBEFORE (baseline checkout) and AFTER (this checkout), same run:")
        print(report.compare(rows))
    if any(r.target == "vllm-router" for r in rows):
        print("\nppd beside vllm-router (x router: ppd / vllm-router), same run:")
        print(report.against_peer(rows))
    out = args.out or RESULTS / f"proxy_overhead-{time.strftime('%Y%m%dT%H%M%S')}.json"
    report.write_json(out, plan, rows, command)
    print(f"written {out}")
    errors = sum(r.result["errors"] + r.extra.get("long_errors", 0) for r in rows)
    return 1 if errors else 0
