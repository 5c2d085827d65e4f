"""A real replay run simulated again: same workload, rate, duration, seed and forced route.

`ppd sim calibrate` uses it to settle the front end and the P->D hand-off against the engine
model's own dynamics, and benchmarks/cpu_validation.py to put every run beside its prediction.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from profiler.simulator.run import RunSpec, SimResult, simulate
from proxy.shared.vocabulary import RouteKind


def forced_route(run: Path) -> RouteKind:
    """The route a calibration run forced on turn 2+ (`ppd replay --force-route`)."""
    rows = pd.read_csv(run / "requests.csv")
    routes = set(rows.loc[rows["turn"] >= 2, "route"].dropna())
    if len(routes) != 1:
        raise ValueError(f"{run}: turn 2 was not forced to one route ({sorted(routes)})")
    return RouteKind(routes.pop())


def twin_spec(run: Path, cost: str, *, layout: str = "1P1D", model: str = "tiny",
              reply_retokenized: bool = False) -> RunSpec:
    document = json.loads((run / "summary.json").read_text())
    config = document["config"]
    return RunSpec(layout=layout, dataset=document["dataset"], qps=float(config["qps"]),
                   cost=cost, model=model, duration_s=float(config["duration_s"]),
                   timeout_s=float(config["timeout_s"]), seed=int(config["seed"]),
                   max_turns=config.get("max_turns"), forced_route=forced_route(run),
                   reply_retokenized=reply_retokenized)


def simulate_twin(run: Path, cost: str, **options: object) -> SimResult:
    return simulate(twin_spec(run, cost, **options))  # type: ignore[arg-type]


def twin_ttft_gap_ms(run: Path, cost: str, model: str, reply_retokenized: bool,
                     route: RouteKind) -> float | None:
    """The run simulated again on `cost`: its `ttft_gap_ms` on `route` (what `ppd sim
    calibrate`'s second pass settles on; `profiler.engine.actions.TwinGap`)."""
    simulated = simulate_twin(run, cost, model=model, reply_retokenized=reply_retokenized)
    return ttft_gap_ms(run, simulated, route)


def ttft_gap_ms(run: Path, result: SimResult, route: RouteKind = RouteKind.PD) -> float | None:
    """Median TTFT of the real run's turns on `route` less the simulated one's (P->D: turn
    1, and turn 2 when it was forced P->D; local: turn 2 forced local); None when the run
    has no such turn."""
    rows = pd.read_csv(run / "requests.csv")
    real = rows[rows["success"].astype(bool) & (rows["route"] == route.value)][
        "ttft_ms"].dropna()
    simulated = [r.ttft_s * 1000 for r in result.records
                 if r.success and r.route == route.value and r.ttft_s is not None]
    if real.empty or not simulated:
        return None
    return float(real.median()) - float(pd.Series(simulated).median())
