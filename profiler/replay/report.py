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
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from profiler.cli import HelpFormatter
from profiler.replay.output import SUMMARY_FILE, format_value

# (row label, summary key) of the side-by-side table.
COMPARE_ROWS: tuple[tuple[str, str], ...] = (
    ("conversations/s (offered)", "_qps"),
    ("requests ok/all", "_requests"),
    ("success rate", "success_rate"),
    ("turn-1 TTFT mean ms", "turn1_ttft_ms_mean"),
    ("turn-1 TTFT p99 ms", "turn1_ttft_ms_p99"),
    ("turn-2+ TTFT mean ms", "turn2plus_ttft_ms_mean"),
    ("turn-2+ TTFT p50 ms", "turn2plus_ttft_ms_p50"),
    ("turn-2+ TTFT p90 ms", "turn2plus_ttft_ms_p90"),
    ("turn-2+ TTFT p99 ms", "turn2plus_ttft_ms_p99"),
    ("TPOT mean ms", "tpot_ms_mean"),
    ("TPOT p99 ms", "tpot_ms_p99"),
    ("output tok/s", "output_tok_s"),
    ("total tok/s", "total_tok_s"),
    ("requests/s (measured)", "requests_s"),
    ("local share (turn 2+)", "local_share"),
    ("SLO attainment", "slo_attainment"),
)
# The summary values the table and plots read as numbers (null: not measured in that run).
NUMBER_KEYS = (*(key for _, key in COMPARE_ROWS if not key.startswith("_")), "ttft_ms_p99",
               "n_success", "n_requests")


@dataclass(frozen=True, slots=True)
class Run:
    """One replay run as read back from its summary.json."""

    path: Path
    label: str
    qps: float  # the conversation rate offered
    summary: dict[str, Any]
    backend: str | None = None  # set when the run was not on vLLM (e.g. emulated nodes)
    dataset: str | None = None
    target: str | None = None
    interrupted: bool = False
    seed: int | None = None  # the replay's --seed: with the dataset, which conversations ran
    # The nodes' prefix caches were emptied before it ran (`ppd replay --reset-prefix-cache`),
    # or it ran on a fresh simulated cluster: an earlier run's prompts cannot be cached.
    cold_start: bool = False

    @property
    def series(self) -> str:
        return self.label.split("@", 1)[0]


def load_run(path: Path) -> Run:
    """The run in directory path (or a summary.json path itself)."""
    file = path / SUMMARY_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{path} has no {SUMMARY_FILE} (not a `ppd replay --out` dir?)")
    if file.suffix in (".parquet", ".csv"):
        raise ValueError(f"{file} is {what_table(file)}, not a replay run: `ppd report compare` "
                         "reads the directories `ppd replay --out DIR` (or `ppd sim run --out "
                         f"DIR`) writes, e.g. `ppd report compare runs/pd@1 runs/ppd@1`")
    try:
        document = json.loads(file.read_text())
        summary = document["summary"]
        load = document.get("load") or {}
        qps = float(load.get("conversation_rate", document["config"]["qps"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{file} is not a ppd replay summary ({exc})") from None
    check_summary(summary, file)
    label = str(document.get("label") or file.parent.name)
    backend = document.get("backend")
    seed = document["config"].get("seed") if isinstance(document.get("config"), dict) else None
    return Run(path=file.parent, label=label, qps=qps, summary=summary,
               dataset=document.get("dataset"), target=document.get("target"),
               interrupted=bool(document.get("interrupted")),
               backend=str(backend) if backend else None,
               seed=seed if isinstance(seed, int) else None,
               cold_start=document.get("reset_prefix_cache") is True
               or document.get("simulated") is True)


def check_summary(summary: Any, file: Path) -> None:
    """Raise a ValueError that names file and what is wrong unless summary is what the table
    and plots read: an object whose NUMBER_KEYS hold numbers or null (checked here, since
    pandas and matplotlib would say it later and without the file)."""
    if not isinstance(summary, dict):
        raise ValueError(f'{file}: its "summary" is {_shown(summary)}, not the run\'s metrics '
                         "(an object of name: value, as `ppd replay` writes it)")
    bad = [key for key in NUMBER_KEYS if key in summary and not _number_or_null(summary[key])]
    if bad:
        listed = "; ".join(f'"{key}" is {_shown(summary[key])}' for key in bad)
        raise ValueError(f"{file}: in its summary, {listed}: a number (or null) was expected")


def _number_or_null(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _shown(value: Any) -> str:
    """A JSON value as it reads in the file, cut short."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def what_table(path: Path) -> str:
    """What a table file given in place of a run directory is, and which command reads it."""
    from profiler.tables.io import TABLE_COLUMNS

    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            columns = set(pq.read_schema(path).names)
        else:
            import pandas as pd

            columns = set(pd.read_csv(path, nrows=0).columns)
    except Exception:  # noqa: BLE001 - unreadable: say so instead of guessing
        return "a table file ppd cannot read"
    if {"layout", "dataset", "qps", "policy"} <= columns:
        return "a simulator grid (`ppd sim grid`; `ppd sim paper FILE` reads it)"
    if set(TABLE_COLUMNS) <= columns:
        return "a decision table (`ppd profile`; `ppd table show FILE` reads it)"
    if {"conversation_id", "turn", "ttft_ms"} <= columns:
        return f"a run's request table (pass its directory, {path.parent})"
    return "a table file"


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
