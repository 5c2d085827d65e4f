"""Out-of-sample check of a calibrated preset against real replay runs.

Every run directory (a `ppd replay` of a 1P1D cluster with turn 2 forced local or P->D, as
`scripts/calibration_runs.sh` makes them) is simulated again - same synthetic workload, rate,
duration, seed and forced route - on the preset, and turn-2 TTFT p50 and turn-2 TPOT mean are
printed side by side with the error. Runs the preset was fitted on are marked `fit`. With
`--emulated DIR` (the same runs made against `ppd cluster up --emulate` nodes serving the
preset), each cell also gives the emulated measurement and its error against the real one.

    python -m benchmarks.cpu_validation RUN... --cost cpu-tiny.json --fitted RUN1 RUN2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from profiler.engine.calibrate import read_run
from profiler.replay.metrics import summarize
from profiler.simulator.replay_twin import forced_route, simulate_twin

METRICS = (("turn2plus_ttft_ms_p50", "T2 TTFT p50"), ("turn2plus_tpot_ms_mean", "T2 TPOT mean"),
           ("decode_itl_ms", "D's ITL (server)"))


def predict(run: Path, cost: str, layout: str, model: str,
            reply_retokenized: bool = False) -> tuple[dict, dict]:
    document = json.loads((run / "summary.json").read_text())
    result = simulate_twin(run, cost, layout=layout, model=model,
                           reply_retokenized=reply_retokenized)
    predicted = summarize(result.records, result.wall_time_s)
    decode = next(stats for url, stats in result.node_stats.items() if url.startswith("http://d"))
    count = decode.get("inter_token_latency_seconds_count", 0.0)
    predicted["decode_itl_ms"] = (decode["inter_token_latency_seconds_sum"] / count * 1000
                                  if count else None)
    measured = dict(document["summary"])
    node = next((n for n in read_run(run).nodes if n.role == "decode"), None)
    measured["decode_itl_ms"] = node.mean_ms("inter_token_latency_seconds") if node else None
    return measured, predicted


def _load(run: Path) -> str:
    """The machine's 1-minute load average when the run started."""
    path = run / "load-before.txt"
    return path.read_text().split("load average:")[-1].split(",")[0].strip() \
        if path.is_file() else "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--cost", required=True, help="preset (a JSON from ppd sim calibrate)")
    parser.add_argument("--fitted", nargs="*", type=Path, default=[],
                        help="the runs the preset was fitted on (marked in the table)")
    parser.add_argument("--repeat", type=Path, default=None,
                        help="a directory with the same runs made again: printed beside, so "
                        "the run-to-run spread of the measurement shows next to the error")
    parser.add_argument("--emulated", type=Path, default=None,
                        help="a directory with the same runs made against emulated nodes "
                        "serving the preset: printed beside, with their error against real")
    parser.add_argument("--layout", default="1P1D")
    parser.add_argument("--model", default="tiny", help="KV shape for the transfer bytes")
    parser.add_argument("--reply-retokenized", action="store_true",
                        help="simulate replies that come back as other token ids (what "
                        "`ppd sim calibrate` reports for the tiny CPU model)")
    args = parser.parse_args(argv)
    fitted = {path.resolve() for path in args.fitted}
    again = ("; again" if args.repeat else "") + ("; emulated" if args.emulated else "")
    header = "| run | route | set | load | " + " | ".join(
        f"{label} real / sim ms (err){again}" for _, label in METRICS) + " |"
    print(header)
    print("|" + "---|" * (4 + len(METRICS)))
    errors: dict[str, list[float]] = {key: [] for key, _ in METRICS}
    emulated_errors: dict[str, list[float]] = {key: [] for key, _ in METRICS}
    for run in args.runs:
        real, sim = predict(run, args.cost, args.layout, args.model,
                            args.reply_retokenized)
        load = _load(run)
        repeat = args.repeat / run.name if args.repeat else None
        if repeat is not None and (repeat / "summary.json").is_file():
            real_again, _ = predict(repeat, args.cost, args.layout, args.model,
                                        args.reply_retokenized)
            load += f"; {_load(repeat)}"
        else:
            real_again = None
        emulated = args.emulated / run.name if args.emulated else None
        real_emulated = None
        if emulated is not None and (emulated / "summary.json").is_file():
            real_emulated, _ = predict(emulated, args.cost, args.layout, args.model,
                                       args.reply_retokenized)
            load += f"; {_load(emulated)}"
        role = "fit" if run.resolve() in fitted else "test"
        cells = []
        for key, _ in METRICS:
            measured, predicted = real.get(key), sim.get(key)
            if measured is None or predicted is None:
                cells.append("-")
                continue
            error = (predicted - measured) / measured
            if role == "test":
                errors[key].append(abs(error))
            cell = f"{measured:.1f} / {predicted:.1f} ({error:+.0%})"
            if real_again is not None and real_again.get(key) is not None:
                second = real_again[key]
                cell += f"; {second:.1f} ({(predicted - second) / second:+.0%})"
                if role == "test":
                    errors[key].append(abs((predicted - second) / second))
            if real_emulated is not None and real_emulated.get(key) is not None:
                value = real_emulated[key]
                cell += f"; {value:.1f} ({(value - measured) / measured:+.0%} vs real)"
                emulated_errors[key].append(abs((value - measured) / measured))
            cells.append(cell)
        route = forced_route(run).value
        print(f"| {run.name} | {route} | {role} | {load.strip()} | " + " | ".join(cells) + " |")
    for key, label in METRICS:
        values = sorted(errors[key])
        if values:
            within = sum(v <= 0.15 for v in values)
            print(f"{label}: out-of-sample median |error| {values[len(values) // 2]:.0%}, "
                  f"{within} of {len(values)} within 15%")
        values = sorted(emulated_errors[key])
        if values:
            within = sum(v <= 0.15 for v in values)
            print(f"{label}: emulated against real, median |error| "
                  f"{values[len(values) // 2]:.0%}, {within} of {len(values)} within 15%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
