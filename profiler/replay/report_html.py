"""`ppd report show RUN` and `ppd report compare --html`: one self-contained HTML page.

The page carries everything it shows: the plots are PNGs inlined as base64 data URIs
(matplotlib), the style is inline, nothing is fetched (no CDN), so it opens from a mail
attachment or an artifact store. The run directory's requests.parquet (requests.csv when
Parquet is missing) and summary.json stay the source; the page is drawn from them and can be
drawn again.

A run's page: the summary table, TTFT and TPOT distributions by turn (1, 2, 3, 4+) and by
route, the route mix over the run's time, and the failures (by error, and over time). A
small inline script counts the images the browser decoded and writes the count into the page
(`#render-check`), so a headless browser's DOM dump shows whether the plots rendered.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.replay.output import REQUESTS_CSV, REQUESTS_PARQUET, TABLE_ROWS, format_value

if TYPE_CHECKING:
    import pandas as pd

    from profiler.replay.report_runs import Run

REPORT_FILE = "report.html"
COMPARE_FILE = "compare.html"
TIME_BINS = 30  # bins of the route-mix-over-time plot
_STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1200px}"
          "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;"
          "text-align:right}th:first-child,td:first-child{text-align:left}"
          "img{max-width:100%;display:block;margin:1em 0}.note{color:#555}")
# Counts the images decoded (naturalWidth > 0) once the page has loaded.
_CHECK = ("<script>window.addEventListener('load',function(){var i=document.images,n=0;"
          "for(var k=0;k<i.length;k++){if(i[k].complete&&i[k].naturalWidth>0){n++;}}"
          "document.getElementById('render-check').textContent='images '+i.length+"
          "' decoded '+n;});</script>")


def read_requests(run_dir: Path) -> pd.DataFrame:
    """A run's per-request table: requests.parquet, else requests.csv."""
    import pandas as pd

    parquet, csv = run_dir / REQUESTS_PARQUET, run_dir / REQUESTS_CSV
    if parquet.is_file():
        return pd.read_parquet(parquet)
    if csv.is_file():
        return pd.read_csv(csv)
    raise FileNotFoundError(f"{run_dir} has neither {REQUESTS_PARQUET} nor {REQUESTS_CSV} "
                            "(a `ppd replay --out` or `ppd sim run --out` directory has both)")


def run_page(run: Run) -> str:
    """The HTML page of one run."""
    frame = read_requests(run.path)
    ok = frame[frame["success"].astype(bool)]
    sections = [
        ("Summary", _summary_table({**run.summary, "conversation_rate": run.qps})),
        ("TTFT by turn and route", _img(_distribution(ok, "ttft_ms", "TTFT (ms)"))),
        ("TPOT by turn and route", _img(_distribution(ok, "tpot_ms", "TPOT (ms)"))),
        ("Route mix over time", _img(_route_mix(frame))),
        ("Failures", _failures(frame)),
    ]
    notes = [f"dataset {run.dataset}" if run.dataset else "", f"target {run.target}"
             if run.target else "", run.backend or "", "interrupted" if run.interrupted else ""]
    return _page(f"ppd report: {run.label}", [note for note in notes if note], sections)


def compare_page(runs: Sequence[Run], plots: Sequence[Path], table: str,
                 warnings: Sequence[str]) -> str:
    """The HTML page of `ppd report compare`: its table, its plots, and each run's TTFT."""
    sections = [("Side by side", f"<pre>{html.escape(table)}</pre>")]
    if warnings:
        sections.append(("Warnings", "<ul>" + "".join(f"<li>{html.escape(w)}</li>"
                                                      for w in warnings) + "</ul>"))
    sections += [(path.stem.replace("_", " "), _img(path.read_bytes())) for path in plots]
    for run in runs:
        frame = read_requests(run.path)
        ok = frame[frame["success"].astype(bool)]
        sections.append((f"{run.label}: TTFT by turn and route",
                         _img(_distribution(ok, "ttft_ms", "TTFT (ms)"))))
    return _page("ppd report compare: " + ", ".join(run.label for run in runs), [], sections)


def _page(title: str, notes: Sequence[str], sections: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<h2>{html.escape(name)}</h2>{content}" for name, content in sections)
    note = f"<p class='note'>{html.escape('; '.join(notes))}</p>" if notes else ""
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>{note}"
            "<p class='note'>Drawn from the run's requests table and summary.json (the "
            "source); plots inline. <span id='render-check'>images not checked</span></p>"
            f"{body}{_CHECK}</body></html>")


def _summary_table(summary: dict[str, Any]) -> str:
    rows = []
    for label, key in TABLE_ROWS:
        if key == "_requests":
            value = f"{summary.get('n_success')}/{summary.get('n_requests')}"
        elif f"{key}_mean" in summary:
            value = " / ".join(format_value(summary.get(f"{key}_{stat}"))
                               for stat in ("mean", "p50", "p90", "p99"))
        else:
            value = format_value(summary.get(key))
        rows.append(f"<tr><td>{html.escape(label)}</td><td>{html.escape(value)}</td></tr>")
    if summary.get("routes"):
        routes = ", ".join(f"{k}={v}" for k, v in summary["routes"].items())
        rows.append(f"<tr><td>routes</td><td>{html.escape(routes)}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def _img(png: bytes) -> str:
    return f"<img alt='plot' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


def _turn_group(turn: Any) -> str:
    return f"turn {int(turn)}" if int(turn) < 4 else "turn 4+"


def _distribution(ok: pd.DataFrame, column: str, label: str) -> bytes:
    """Box plots of a latency by turn group, and by route for turns 2+."""
    by_turn = {name: group[column].dropna().tolist()
               for name, group in ok.groupby(ok["turn"].map(_turn_group))}
    later = ok[ok["turn"] >= 2]
    routes = later["route"].fillna("unknown") if "route" in later else later["turn"] * 0
    by_route = {f"turn 2+ {name}": group[column].dropna().tolist()
                for name, group in later.groupby(routes)}

    def draw(axes: Any) -> None:
        for axis, groups, title in ((axes[0], by_turn, "by turn"),
                                    (axes[1], by_route, "turns 2+ by route")):
            kept = {name: values for name, values in sorted(groups.items()) if values}
            if kept:
                axis.boxplot(list(kept.values()), showfliers=False)
                axis.set_xticks(range(1, len(kept) + 1),
                                [f"{name}\n(n={len(values)})" for name, values in kept.items()],
                                fontsize=8)
            else:
                axis.text(0.5, 0.5, "no measurement", ha="center", transform=axis.transAxes)
            axis.set_title(title)
            axis.set_ylabel(label)
            axis.grid(axis="y", alpha=0.3)

    return _figure(draw, columns=2)


def _route_mix(frame: pd.DataFrame) -> bytes:
    """The share of each route among the turns started in each time bin."""
    import numpy as np

    start_s = frame["start_ms"].astype(float) / 1000.0
    routes = frame["route"].fillna("none") if "route" in frame else start_s.map(lambda _: "none")
    edges = np.linspace(0.0, max(float(start_s.max()) if len(start_s) else 1.0, 1e-9),
                        TIME_BINS + 1)
    bins = np.clip(np.digitize(start_s, edges) - 1, 0, TIME_BINS - 1)
    counts = frame.assign(_bin=bins, _route=routes).groupby(["_bin", "_route"]).size()
    table = counts.unstack(fill_value=0).reindex(range(TIME_BINS), fill_value=0)
    shares = table.div(table.sum(axis=1).replace(0, 1), axis=0)

    def draw(axes: Any) -> None:
        axis = axes[0]
        if shares.empty:
            axis.text(0.5, 0.5, "no requests", ha="center", transform=axis.transAxes)
        else:
            middle = (edges[:-1] + edges[1:]) / 2
            axis.stackplot(middle, [shares[c].to_numpy() for c in shares.columns],
                           labels=[str(c) for c in shares.columns])
            axis.legend(loc="upper right", fontsize=8)
        axis.set_xlabel("request start (s into the run)")
        axis.set_ylabel("share of requests")
        axis.set_ylim(0, 1)

    return _figure(draw, columns=1)


def _failures(frame: pd.DataFrame) -> str:
    failed = frame[~frame["success"].astype(bool)]
    if failed.empty:
        return f"<p>none: all {len(frame)} requests succeeded</p>"
    reasons = failed["error"].fillna("(no error text)").astype(str).str.slice(0, 120)
    rows = "".join(f"<tr><td>{html.escape(reason)}</td><td>{count}</td></tr>"
                   for reason, count in reasons.value_counts().items())

    def draw(axes: Any) -> None:
        axes[0].hist(failed["start_ms"].astype(float) / 1000.0, bins=TIME_BINS, color="tab:red")
        axes[0].set_xlabel("request start (s into the run)")
        axes[0].set_ylabel("failed requests")

    return (f"<p>{len(failed)} of {len(frame)} requests failed</p>"
            f"<table><tr><th>error</th><th>requests</th></tr>{rows}</table>"
            + _img(_figure(draw, columns=1)))


def _figure(draw: Any, *, columns: int) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, columns, figsize=(5.5 * columns, 3.8), squeeze=False)
    try:
        draw(list(axes[0]))
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()
    finally:
        plt.close(figure)
