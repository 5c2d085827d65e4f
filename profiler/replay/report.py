"""`ppd report compare RUN_DIR...`: replay runs side by side, and how latency moves with load.

Each RUN_DIR is a `ppd replay --out` directory (its summary.json). Runs are grouped into series
by label: a label `NAME@ANYTHING` belongs to series NAME (the default label of `ppd replay` is
`DATASET@RATE`, so runs of one dataset at several loads form one series; label policy runs
e.g. `ppd@0.5`, `pd@0.5` to compare policies). Load is the replay's conversation rate
(conversations/s); the request rate that resulted is the `requests/s` row.

The table has, after every run but the first, a `change` column: its relative change against
the first run (e.g. ppd against pd). Runs that differ in dataset or target are compared with a
warning, since their numbers may not mean the same thing. Outputs in --out: compare.csv and,
with two runs or more, latency_vs_load.png and p99_ttft_vs_throughput.png; compare.html holds
the table and plots in one self-contained page (`report_html`). `ppd report show RUN_DIR`
writes one run's page.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from profiler.cli import HelpFormatter
from profiler.replay.output import format_value
from profiler.replay.report_runs import (  # noqa: F401 - re-exported
    COMPARE_ROWS,
    NUMBER_KEYS,
    Run,
    check_summary,
    load_run,
    what_table,
)


def relative_change(value: Any, base: Any) -> str:
    """`+12.5%` for value against base; `-` when either is not a number or base is 0."""
    if isinstance(value, bool) or isinstance(base, bool):
        return "-"
    if not isinstance(value, int | float) or not isinstance(base, int | float):
        return "-"
    if not (math.isfinite(value) and math.isfinite(base)) or base == 0:
        return "-"
    return f"{(value - base) / abs(base) * 100:+.1f}%"


def _value(run: Run, key: str) -> Any:
    if key == "_qps":
        return run.qps
    if key == "_requests":
        return f"{run.summary.get('n_success')}/{run.summary.get('n_requests')}"
    return run.summary.get(key)


def column_names(runs: Sequence[Run]) -> list[str]:
    """Run labels, made unique with the directory name where two runs share a label."""
    labels = [run.label for run in runs]
    return [run.label if labels.count(run.label) == 1 else f"{run.label} ({run.path.name})"
            for run in runs]


def compare_table(runs: Sequence[Run]) -> str:
    """The runs' key metrics side by side, one column per run, each run after the first
    followed by its change against the first."""
    names: list[str] = []
    for index, name in enumerate(column_names(runs)):
        names += [name] if index == 0 else [name, "change"]
    rows = []
    for label, key in COMPARE_ROWS:
        base = _value(runs[0], key)
        cells = [format_value(base)]
        for run in runs[1:]:
            value = _value(run, key)
            cells += [format_value(value), relative_change(value, base)]
        rows.append((label, cells))
    first = max(len(label) for label, _ in COMPARE_ROWS)
    widths = [max(len(name), *(len(row[1][i]) for row in rows)) for i, name in enumerate(names)]
    header = " " * first + "  " + "  ".join(f"{n:>{w}}" for n, w in zip(names, widths,
                                                                         strict=True))
    lines = [header]
    for label, values in rows:
        cells = "  ".join(f"{v:>{w}}" for v, w in zip(values, widths, strict=True))
        lines.append(f"{label:<{first}}  {cells}")
    return "\n".join(lines)


def write_compare_csv(runs: Sequence[Run], path: Path) -> None:
    """One row per run: label, series, qps, path and every scalar summary value."""
    import pandas as pd

    rows = []
    for run in runs:
        scalars = {k: v for k, v in run.summary.items() if not isinstance(v, dict)}
        rows.append({"label": run.label, "series": run.series, "conversation_rate": run.qps,
                     "dataset": run.dataset, "target": run.target,
                     "interrupted": run.interrupted, "backend": run.backend or "vllm",
                     "path": str(run.path), **scalars})
    pd.DataFrame(rows).to_csv(path, index=False)


def _backend_note(runs: Sequence[Run]) -> str | None:
    """A plot's note when some runs were not on vLLM (emulated nodes say so)."""
    backends = sorted({run.backend for run in runs if run.backend})
    return "; ".join(backends) if backends else None


def _series(runs: Sequence[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.series, []).append(run)
    return {name: sorted(members, key=lambda run: run.qps) for name, members in groups.items()}


def _points(runs: Sequence[Run], x_key: str, y_key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for run in runs:
        x = run.qps if x_key == "_qps" else run.summary.get(x_key)
        y = run.summary.get(y_key)
        if x is not None and y is not None:
            xs.append(float(x))
            ys.append(float(y))
    return xs, ys


def plot_latency_vs_qps(runs: Sequence[Run], path: Path) -> None:
    """TTFT (turn 1, turn 2+) and TPOT against offered load, one line per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("turn1_ttft_ms_p99", "turn-1 TTFT p99 (ms)"),
              ("turn2plus_ttft_ms_mean", "turn-2+ TTFT mean (ms)"),
              ("turn2plus_ttft_ms_p99", "turn-2+ TTFT p99 (ms)"),
              ("tpot_ms_mean", "TPOT mean (ms)"))
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    try:
        for axis, (key, title) in zip(axes, panels, strict=True):
            for name, members in _series(runs).items():
                xs, ys = _points(members, "_qps", key)
                axis.plot(xs, ys, marker="o", label=name)
            axis.set_title(title)
            axis.set_xlabel("conversation rate (conversations/s)")
            _sane_limits(axis, [run.qps for run in runs])
            axis.grid(alpha=0.3)
        axes[0].legend()
        if note := _backend_note(runs):
            figure.suptitle(note, fontsize=9)
        figure.tight_layout()
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)


def plot_ttft_vs_throughput(runs: Sequence[Run], path: Path) -> None:
    """P99 TTFT (all turns and turn 2+) against output throughput, one line per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    try:
        for name, members in _series(runs).items():
            xs, ys = _points(members, "output_tok_s", "ttft_ms_p99")
            line = axis.plot(xs, ys, marker="o", label=f"{name} (all turns)")[0]
            xs2, ys2 = _points(members, "output_tok_s", "turn2plus_ttft_ms_p99")
            axis.plot(xs2, ys2, marker="x", linestyle="--", color=line.get_color(),
                      label=f"{name} (turn 2+)")
            for run in members:
                x, y = run.summary.get("output_tok_s"), run.summary.get("ttft_ms_p99")
                if x is not None and y is not None:
                    axis.annotate(f"{run.qps:g}", (x, y), textcoords="offset points",
                                  xytext=(4, 4), fontsize=8)
        axis.set_xlabel("output tokens / s")
        axis.set_ylabel("P99 TTFT (ms)")
        note = _backend_note(runs)
        axis.set_title("P99 TTFT vs throughput (labels: conversations/s)"
                       + (f"\n{note}" if note else ""))
        _sane_limits(axis, [float(run.summary.get("output_tok_s") or 0.0) for run in runs])
        axis.grid(alpha=0.3)
        axis.legend()
        figure.tight_layout()
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)


def _sane_limits(axis: Any, xs: Sequence[float]) -> None:
    """Axes from 0: one load point (or runs all at one load) would otherwise get a
    0.48-0.52 axis that makes a single point look like a trend."""
    top = max([x for x in xs if math.isfinite(x)], default=0.0)
    axis.set_xlim(0, top * 1.25 if top > 0 else 1.0)
    y_top = float(axis.dataLim.y1) if axis.has_data() else 0.0
    axis.set_ylim(0, y_top * 1.15 if math.isfinite(y_top) and y_top > 0 else 1.0)


def compare(run_dirs: Sequence[Path], out: Path) -> tuple[str, list[Path]]:
    """Load runs, write compare.csv (and plots for 2+ runs) into out; return the table.

    Warnings (different datasets or targets, interrupted runs) go to stderr."""
    from profiler.replay.report_html import COMPARE_FILE, compare_page
    from profiler.replay.report_warnings import mismatch_warnings

    runs = [load_run(path) for path in run_dirs]
    warnings = mismatch_warnings(runs)
    for warning in warnings:
        print(f"ppd report: warning: {warning}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "compare.csv"]
    write_compare_csv(runs, written[0])
    if len(runs) >= 2:
        written += [out / "latency_vs_load.png", out / "p99_ttft_vs_throughput.png"]
        plot_latency_vs_qps(runs, written[1])
        plot_ttft_vs_throughput(runs, written[2])
    table = compare_table(runs)
    page = out / COMPARE_FILE
    page.write_text(compare_page(runs, written[1:], table, warnings))
    return table, [*written, page]


def build_parser() -> argparse.ArgumentParser:
    example = "example:\n  ppd report compare runs/pd@0.5 runs/ppd@0.5 --out runs/compare"
    parser = argparse.ArgumentParser(prog="ppd report", description="Reports on replay runs.",
                                     epilog=example, formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    cmp = sub.add_parser("compare", help="replay runs side by side, latency vs load plots",
                         description=__doc__, epilog=example, formatter_class=HelpFormatter)
    cmp.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    cmp.add_argument("--out", type=Path, help="output directory (default: runs/compare-UTCTIME)")
    show = sub.add_parser("show", help="one run as a self-contained HTML page",
                          description="One run (a `ppd replay --out` or `ppd sim run --out` "
                          "directory) as one self-contained HTML page: summary, TTFT and TPOT "
                          "by turn and route, route mix over time, failures.",
                          formatter_class=HelpFormatter)
    show.add_argument("run", type=Path, metavar="RUN_DIR")
    show.add_argument("--out", type=Path, help="the page to write (default RUN_DIR/report.html)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "show":
        from profiler.replay.report_html import REPORT_FILE, run_page

        page = args.out or args.run / REPORT_FILE
        page.write_text(run_page(load_run(args.run)))
        print(f"wrote {page}")
        return 0
    out = args.out or Path("runs") / f"compare-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    table, written = compare(args.runs, out)
    print(table)
    print("wrote " + ", ".join(str(path) for path in written))
    return 0
