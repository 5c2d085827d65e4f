"""`ppd sim plan`'s figure: each candidate's SLO attainment (with its range over seeds) beside
its turn-2+ TTFT p90 against TPOT p90, the recommendation marked."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

SHOWN = 15  # candidates in the bar panel, best first


def plot_plan(ranked: pd.DataFrame, path: Path, *, title: str) -> Path:
    """Write the figure (PNG) to path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = ranked.head(SHOWN).iloc[::-1]  # best at the top of a horizontal bar chart
    names = [f"{row.layout} {row.policy}" for row in shown.itertuples()]
    figure, (bars, scatter) = plt.subplots(1, 2, figsize=(12, 0.35 * len(shown) + 2.5))
    try:
        value = shown["slo_attainment"] * 100
        low = (value - shown["slo_min"] * 100).clip(lower=0)
        high = (shown["slo_max"] * 100 - value).clip(lower=0)
        colours = ["tab:green" if i == len(shown) - 1 else "tab:blue"
                   for i in range(len(shown))]
        bars.barh(names, value, xerr=[low, high], color=colours, capsize=3)
        bars.set_xlabel("SLO attainment (%), range over seeds")
        bars.set_xlim(max(0.0, float(value.min()) - 5) if len(value) else 0, 100.5)
        bars.grid(axis="x", alpha=0.3)
        for row in ranked.itertuples():
            best = row.Index == ranked.index[0]
            scatter.scatter(row.tpot_ms_p90, row.turn2plus_ttft_ms_p90,
                            color="tab:green" if best else "tab:blue",
                            s=60 if best else 25, zorder=3 if best else 2)
        for row in ranked.head(5).itertuples():
            scatter.annotate(f"{row.layout} {row.policy}",
                             (row.tpot_ms_p90, row.turn2plus_ttft_ms_p90),
                             textcoords="offset points", xytext=(4, 4), fontsize=8)
        scatter.set_xlabel("TPOT p90 (ms)")
        scatter.set_ylabel("turn-2+ TTFT p90 (ms)")
        scatter.grid(alpha=0.3)
        figure.suptitle(title, fontsize=10)
        figure.tight_layout()
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)
    return path
