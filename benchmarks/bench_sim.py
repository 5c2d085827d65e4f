"""Engine-model speed: cost-model calls per second (cached and not) and engine steps per second.

`python -m benchmarks.bench_sim` prints one table. What it bounds: the virtual-time simulator
(issue 13) runs millions of steps, and an emulated node must finish a step's bookkeeping far
inside the step's modelled duration (~10 ms on an H100).

Rows:
- aic uncached: one aiconfigurator call per batch shape (random mixed shapes);
- aic cached: the same shapes again through AicCost's bucketed memo;
- linear: LinearCost, the floor for a cost call;
- engine steps: a 64-request decode-heavy workload on one H100 engine (prefix cache, chunked
  prefill, mixed steps), in steps/s of wall time, and the virtual seconds simulated per
  wall second;
- request-steps: 128 requests decoding together, one step after another: the engine's own
  bookkeeping per request per step (a cluster simulator's inner loop), in request-steps/s.
The machine's load average is printed: on a shared machine the rates move with it.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time

from profiler.engine import BatchShape, Engine, EngineConfig, LinearCost, Request, simulate
from profiler.engine.aic import load_preset


def random_shapes(n: int, rng: random.Random) -> list[BatchShape]:
    shapes = []
    for _ in range(n):
        decode = rng.randint(0, 128)
        prefill = rng.choice((0, rng.randint(1, 8192)))
        if not decode and not prefill:
            decode = 1
        shapes.append(BatchShape(1 if prefill else 0, prefill, rng.randint(0, 4096) if prefill
                                 else 0, decode, decode * rng.randint(128, 8192)))
    return shapes


def time_calls(call, shapes: list[BatchShape]) -> float:
    """Calls per second over the shapes."""
    start = time.perf_counter()
    for shape in shapes:
        call(shape)
    return len(shapes) / (time.perf_counter() - start)


def engine_run(cost, n_requests: int, rng: random.Random) -> tuple[int, float, float]:
    """(steps, wall seconds, virtual seconds) for one engine serving a Poisson workload."""
    engine = Engine(EngineConfig(max_num_batched_tokens=2048, num_kv_blocks=8192), cost)
    arrivals, t = [], 0.0
    system = [rng.randrange(128256) for _ in range(512)]  # a shared system prompt
    for i in range(n_requests):
        t += rng.expovariate(8.0)
        prompt = system + [rng.randrange(128256) for _ in range(rng.randint(100, 3000))]
        arrivals.append((t, Request(f"r{i}", max_tokens=rng.randint(50, 400),
                                    prompt_token_ids=prompt)))
    start = time.perf_counter()
    result = simulate(engine, arrivals)
    return result.num_steps, time.perf_counter() - start, result.end_time


def decode_request_steps(n_steps: int = 300, batch: int = 128) -> float:
    """Request-steps per second of a steady batch of decodes (cost model: LinearCost)."""
    rng = random.Random(2)
    engine = Engine(EngineConfig(max_num_batched_tokens=1 << 20),
                    LinearCost("linear", "bench", 10.0, 0.1, 0.1))
    for i in range(batch):
        engine.submit(Request(f"r{i}", max_tokens=n_steps + 2, prompt_token_ids=[
            rng.randrange(50_000) for _ in range(1000)]), 0.0)
    engine.step(0.0)  # the prompts
    start = time.perf_counter()
    for _ in range(n_steps):
        engine.step(0.0)
    return n_steps * batch / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_sim", description=__doc__)
    parser.add_argument("--shapes", type=int, default=5000, help="batch shapes timed per row")
    parser.add_argument("--requests", type=int, default=64, help="requests in the engine run")
    args = parser.parse_args(argv)
    rng = random.Random(0)
    print(f"ppd engine-model benchmark - {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    aic = load_preset("h100:llama-3.1-8b")
    aic.step_ms_uncached(BatchShape(1, 16))  # load the model (~2 s) outside the timing
    shapes = random_shapes(args.shapes, rng)
    linear = LinearCost("linear", "bench", 10.0, 0.1, 1.0, 0.01, 0.001)
    uncached = time_calls(aic.step_ms_uncached, shapes)
    time_calls(aic.step_ms, shapes)  # fill the memo
    rows = [
        ("aic uncached (calls/s)", uncached),
        ("aic cached (calls/s)", time_calls(aic.step_ms, shapes)),
        ("linear (calls/s)", time_calls(linear.step_ms, shapes)),
    ]
    for label, cost in (("h100 aic", aic), ("linear", linear)):
        steps, wall, virtual = engine_run(cost, args.requests, random.Random(1))
        rows.append((f"engine steps/s, {label}", steps / wall))
        rows.append((f"virtual s per wall s, {label}", virtual / wall))
    rows.append(("request-steps/s, 128 decoding", decode_request_steps()))
    width = max(len(label) for label, _ in rows)
    print(f"{'what':<{width}}  {'rate':>12}")
    print("-" * (width + 14))
    for label, rate in rows:
        print(f"{label:<{width}}  {rate:>12,.0f}")
    print(f"aic memo: {len(aic._cache)} buckets, {aic.calls} uncached calls in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
