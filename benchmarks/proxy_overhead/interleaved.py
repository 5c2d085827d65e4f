"""Concurrency 1, stacks measured in alternating slices: the fair c1 comparison on a busy box.

    python -m benchmarks.proxy_overhead.interleaved --policy pd --turns 1 \
        --stack default --stack floor [--stack baseline --baseline TREE] [--rounds 6]

At concurrency 1 a row's TTFT is a handful of loopback hops, each waiting for a core, so rows
measured minutes apart differ by more than the stacks do. Here every target (direct first)
runs for `--slice` seconds in turn, `--rounds` times, all proxies up at once; the medians over
the rounds are printed with each round's p50, and the proxy's CPU per 1000 requests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path

from benchmarks.proxy_overhead import runner
from benchmarks.proxy_overhead.proxy_process import STACKS
from proxy.policies import pd as pd_policy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", choices=runner.POLICIES, default=pd_policy.NAME)
    parser.add_argument("--turns", type=int, default=1, help="turns per conversation")
    parser.add_argument("--stack", action="append", choices=(*STACKS, "baseline"),
                        help="proxy stacks to compare (repeatable; default: default, floor)")
    parser.add_argument("--baseline", type=Path, metavar="TREE",
                        help="another checkout, measured as stack `baseline`")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--slice", type=float, default=2.0, help="seconds per target per round")
    args = parser.parse_args(argv)
    stacks = args.stack or ["default", "floor"]
    if args.policy not in runner.FIXED and "floor" in stacks:
        parser.error("the floor relays; it has no ppd policy (use pd or local)")
    job = {"warmup": 0.3, "duration": args.slice, "tokens": 16, "turns": args.turns,
           "concurrency": 1}
    ttft: dict[str, list[float]] = {"direct": []}
    cpu: dict[str, list[float]] = {"direct": []}
    gen = runner.LoadGenerator()
    try:
        with runner.backend(16) as (prefill, decode), ExitStack() as stack:
            targets: dict[str, tuple[str, int | None]] = {"direct": (decode, None)}
            for name in stacks:
                targets[name] = stack.enter_context(
                    runner.proxy(args.policy, name, prefill, decode, args.baseline))
                ttft[name], cpu[name] = [], []
            for _ in range(args.rounds):
                for name, (url, pid) in targets.items():
                    result, per_1k, _ = runner.measure(gen, url, pid, job)
                    ttft[name].append(result["ttft_p50_ms"])
                    cpu[name].append(per_1k or 0.0)
    finally:
        gen.close()
    direct = statistics.median(ttft["direct"])
    print(f"policy {args.policy}, {args.turns}-turn conversations, concurrency 1, "
          f"{args.rounds} rounds of {args.slice:g} s")
    print("| target | TTFT p50 ms (median of rounds) | x direct | CPU s/1k req | rounds |")
    print("|---|---|---|---|---|")
    for name, values in ttft.items():
        median = statistics.median(values)
        spent = f"{statistics.median(cpu[name]):.2f}" if name != "direct" else "-"
        rounds = " ".join(f"{v:.2f}" for v in values)
        print(f"| {name} | {median:.3f} | {median / direct:.2f} | {spent} | {rounds} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
