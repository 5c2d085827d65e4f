"""`python -m benchmarks.fuzz` (`make fuzz`): the fuzz property of
tests/proxy/behaviour/test_fuzz.py on many more cases (10,000 by default) and both policies
that change the path a body takes.

Prints how the proxy answered (status counts) and the rate; exits 1 on the first case that
breaks the property (hypothesis shrinks it and prints it).
"""

from __future__ import annotations

import argparse
import sys
import time

from hypothesis import HealthCheck, given, settings

from proxy.config.policy_config import Policy
from tests.proxy.behaviour.fuzz_cases import Case, cases, fuzz_target


def run(policy: Policy, n_cases: int) -> tuple[dict[int, int], float]:
    """Fuzz a proxy under policy with n_cases cases; its answers by status and the seconds."""
    started = time.perf_counter()
    with fuzz_target(policy) as target:

        @settings(max_examples=n_cases, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=cases())
        def property_holds(case: Case) -> None:
            target.check(case)

        property_holds()
        if set(target.in_flight().values()) != {0}:
            raise AssertionError(f"left in flight after the run: {target.in_flight()}")
    return target.answered, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__)
    parser.add_argument("--cases", type=int, default=10_000, help="cases per policy")
    args = parser.parse_args(argv)
    print(f"{'policy':<8} {'cases':>7} {'seconds':>8} {'cases/s':>8}  answers by status")
    for policy in (Policy.LOCAL, Policy.PD):
        try:
            answered, seconds = run(policy, args.cases)
        except AssertionError as exc:
            print(f"{policy.value}: property broken: {exc}", file=sys.stderr)
            return 1
        total = sum(answered.values())
        counts = ", ".join(f"{status}: {n}" for status, n in sorted(answered.items()))
        print(f"{policy.value:<8} {total:>7} {seconds:>8.1f} {total / seconds:>8.0f}  {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
