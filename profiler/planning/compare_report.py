"""`ppd sim compare`'s outputs from its grid: the table, the verdict, the plot.

A *cell* of the comparison is a (layout, time scale); its windows are pooled. SLO attainment
is pooled over the windows' turns (met / all); the latency percentiles are the mean of the
windows' own (percentiles do not pool); history recomputed and KV moved are summed.
The verdict checks issue #43's bar: live has the highest attainment of all policies, within
BAR_TIE, in every cell, and beats the best anchor rule by BAR_MARGIN (relative) in at least
BAR_SHARE of the cells at time scale >= 1.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from profiler.planning.contenders import ANCHORS, FIXED, LIVE, PPD

BAR_TIE = 0.02  # issue #43's "within 0.02"
BAR_MARGIN = 0.10  # its "by at least 10% (relative)"
BAR_SHARE = 1 / 3  # its "in at least a third of the cells at time scale 1 or more"
CELL = ["layout", "time_scale"]


def cell_table(grid: pd.DataFrame) -> pd.DataFrame:
    """One row per (layout, time scale, policy), windows pooled (module docstring)."""
    frame = grid.rename(columns={"qps": "time_scale"})
    grouped = frame.groupby([*CELL, "policy"], sort=True)
    table = grouped.agg(
        windows=("window", "nunique"), turns=("n_requests", "sum"),
        slo_met=("slo_met", "sum"), success_rate=("success_rate", "mean"),
        ttft2_p50_ms=("turn2plus_ttft_ms_p50", "mean"),
        ttft2_p90_ms=("turn2plus_ttft_ms_p90", "mean"),
        tpot_p50_ms=("tpot_ms_p50", "mean"), tpot_p90_ms=("tpot_ms_p90", "mean"),
        history_recomputed_mtok=("history_tokens_recomputed", "sum"),
        kv_moved_gb=("kv_bytes_moved", "sum"), local_share=("local_share", "mean"),
    ).reset_index()
    table["slo_attainment"] = table["slo_met"] / table["turns"].where(table["turns"] > 0)
    table["history_recomputed_mtok"] /= 1e6
    table["kv_moved_gb"] /= 1e9
    return table


def attainment_matrix(table: pd.DataFrame) -> pd.DataFrame:
    """SLO attainment, a row per (layout, time scale), a column per policy."""
    matrix = table.pivot_table(index=CELL, columns="policy", values="slo_attainment")
    order = [p for p in (*_fixed(table), *ANCHORS, PPD, LIVE) if p in matrix.columns]
    return matrix[order + [p for p in matrix.columns if p not in order]]


def verdict_lines(table: pd.DataFrame) -> list[str]:
    """Who wins each cell, live's margin over the best anchor, and issue #43's bar."""
    matrix = attainment_matrix(table)
    lines = []
    anchors = [p for p in ANCHORS if p in matrix.columns]
    tied = margins = high_cells = 0
    for (layout, scale), row in matrix.iterrows():
        best = row.max()
        winners = [p for p, v in row.items() if v == best]
        text = f"{layout} x{scale:g}: highest {best:.3f} ({', '.join(winners)})"
        if LIVE in row and anchors:
            anchor = row[anchors].idxmax()
            margin = row[LIVE] / row[anchor] - 1 if row[anchor] > 0 else float("inf")
            text += (f"; live {row[LIVE]:.3f}, best anchor {anchor} {row[anchor]:.3f} "
                     f"(live {margin:+.1%})")
            tied += row[LIVE] >= best - BAR_TIE
            if scale >= 1:
                high_cells += 1
                margins += margin >= BAR_MARGIN
        lines.append(text)
    if LIVE in matrix.columns and anchors:
        cells = len(matrix)
        needed = -(-high_cells // 3)
        met = tied == cells and margins >= BAR_SHARE * high_cells
        lines.append(
            f"issue #43's bar: live within {BAR_TIE} of the highest in {tied}/{cells} cells "
            f"(needs all); >= {BAR_MARGIN:.0%} over the best anchor in {margins}/{high_cells} "
            f"cells at time scale >= 1 (needs {needed}): {'MET' if met else 'NOT MET'}")
    return lines


def table_markdown(table: pd.DataFrame) -> str:
    """The attainment matrix and the per-policy details, as markdown."""
    matrix = attainment_matrix(table)
    head = ["layout", "scale", *matrix.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (layout, scale), row in matrix.iterrows():
        best = row.max()
        cells = [f"**{v:.3f}**" if v == best else f"{v:.3f}" for v in row]
        lines.append(f"| {layout} | {scale:g} | " + " | ".join(cells) + " |")
    detail = ["", "| layout | scale | policy | turns | SLO | success | TTFT2+ p50 / p90 ms | "
              "TPOT p50 / p90 ms | history recomputed Mtok | KV moved GB | local share |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in table.itertuples():
        detail.append(
            f"| {row.layout} | {row.time_scale:g} | {row.policy} | {row.turns} | "
            f"{row.slo_attainment:.3f} | {row.success_rate:.3f} | {row.ttft2_p50_ms:.0f} / "
            f"{row.ttft2_p90_ms:.0f} | {row.tpot_p50_ms:.1f} / {row.tpot_p90_ms:.1f} | "
            f"{row.history_recomputed_mtok:.1f} | {row.kv_moved_gb:.0f} | "
            f"{row.local_share:.2f} |")
    return "\n".join(lines + detail) + "\n"


def plot_attainment(table: pd.DataFrame, path: Path) -> Path:
    """SLO attainment against time scale, a line per policy, a panel per layout (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layouts = sorted(table["layout"].unique())
    figure, axes = plt.subplots(1, len(layouts), figsize=(5 * len(layouts), 4.2),
                                sharey=True, squeeze=False)
    try:
        for axis, layout in zip(axes[0], layouts, strict=True):
            part = table[table["layout"] == layout]
            for policy in attainment_matrix(table).columns:
                line = part[part["policy"] == policy].sort_values("time_scale")
                strong = policy in (LIVE, PPD)
                axis.plot(line["time_scale"], line["slo_attainment"], marker="o",
                          linewidth=2.4 if strong else 1.2,
                          linestyle="-" if strong or policy in ANCHORS else "--",
                          label=policy)
            axis.set_xscale("log", base=2)
            axis.set_title(layout)
            axis.set_xlabel("time scale (x the trace's rate)")
            axis.grid(alpha=0.3)
        axes[0][0].set_ylabel("SLO attainment")
        axes[0][-1].legend(fontsize=7, loc="lower left")
        figure.tight_layout()
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)
    return path


def write_report(grid: pd.DataFrame, out: Path) -> list[str]:
    """table.md and attainment.png under out; the lines to print (table and verdict)."""
    out.mkdir(parents=True, exist_ok=True)
    table = cell_table(grid)
    markdown = table_markdown(table)
    verdict = verdict_lines(table)
    (out / "table.md").write_text(markdown + "\n" + "\n".join(f"- {v}" for v in verdict)
                                  + "\n")
    plot_attainment(table, out / "attainment.png")
    return [markdown, *verdict, f"wrote {out / 'table.md'}, {out / 'attainment.png'}"]


def _fixed(table: pd.DataFrame) -> tuple[str, ...]:
    return tuple(p for p in FIXED if p in set(table["policy"]))


__all__ = ["ANCHORS", "attainment_matrix", "cell_table", "plot_attainment", "table_markdown",
           "verdict_lines", "write_report"]
