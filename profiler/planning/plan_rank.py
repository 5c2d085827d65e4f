"""`ppd sim plan`'s answer: the candidates ranked, one recommendation, and when not to trust it.

Candidates (layout, policy) are ranked by SLO attainment (mean over the seeds each ran), then
turn-2+ TTFT p90, then TPOT p90; those run on every seed (confirmed) before those screened on
one, so a lucky draw cannot put a screened candidate first. Goodput (turns that met the SLO
per second of the arrival window) is shown, not ranked on: the runs carry the same traffic,
so it follows attainment. The recommendation names the first and its
margin over the runner-up. The ranking is called too close to call when the first two's
attainment ranges over seeds overlap (a range is min..max over the seeds; a candidate run on
one seed has none), and too small a sample when a run holds fewer than MIN_CONVERSATIONS
conversations.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from profiler.simulator.sample_size import MIN_CONVERSATIONS

# (column, ascending): the ranking's order.
ORDER = (("slo_attainment", False), ("turn2plus_ttft_ms_p90", True), ("tpot_ms_p90", True))
MEAN_COLUMNS = ("slo_attainment", "goodput_turns_s", "turn2plus_ttft_ms_p50",
                "turn2plus_ttft_ms_p90", "tpot_ms_p50", "tpot_ms_p90", "n_conversations",
                "success_rate")
# (header, column, format) of the printed table.
TABLE = (("layout", "layout", "{}"), ("policy", "policy", "{}"),
         ("SLO", "slo_attainment", "{:.1%}"), ("range", "_range", "{}"),
         ("goodput/s", "goodput_turns_s", "{:.2f}"),
         ("t2+ TTFT p50", "turn2plus_ttft_ms_p50", "{:.0f}"),
         ("p90 ms", "turn2plus_ttft_ms_p90", "{:.0f}"),
         ("TPOT p50", "tpot_ms_p50", "{:.1f}"), ("p90 ms", "tpot_ms_p90", "{:.1f}"),
         ("seeds", "seeds", "{:d}"))


def rank(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per candidate: the means over its seeds, the attainment's min and max, the
    number of seeds; best first."""
    keys = ["layout", "policy"]
    grouped = rows.groupby(keys, sort=False)
    ranked = grouped[list(MEAN_COLUMNS)].mean()
    ranked["slo_min"] = grouped["slo_attainment"].min()
    ranked["slo_max"] = grouped["slo_attainment"].max()
    ranked["seeds"] = grouped.size()
    ranked = ranked.reset_index()
    ranked["confirmed"] = ranked["seeds"] == ranked["seeds"].max()
    columns = ["confirmed", *(column for column, _ in ORDER)]
    ascending = [False, *(ascending for _, ascending in ORDER)]
    return ranked.sort_values(columns, ascending=ascending, na_position="last",
                              ignore_index=True)


def table_text(ranked: pd.DataFrame, limit: int = 12) -> str:
    """The ranked candidates as an aligned text table (the first `limit`)."""
    shown = ranked.head(limit)
    cells = [[header for header, _, _ in TABLE]]
    for _, row in shown.iterrows():
        cells.append([_cell(row, column, fmt) for _, column, fmt in TABLE])
    widths = [max(len(line[i]) for line in cells) for i in range(len(TABLE))]
    lines = ["  ".join(text.ljust(width) if i < 2 else text.rjust(width)
                       for i, (text, width) in enumerate(zip(line, widths, strict=True)))
             for line in cells]
    lines.insert(0, f"{'#':>2}  " + lines.pop(0))
    lines[1:] = [f"{n:>2}  {line}" for n, line in enumerate(lines[1:], start=1)]
    if len(ranked) > limit:
        lines.append(f"    ... {len(ranked) - limit} more in plan.csv")
    most = int(ranked["seeds"].max()) if len(ranked) else 0
    if most > 1 and (ranked["seeds"] < most).any():
        lines.append(f"    (seeds 1: screened out on the first seed; its numbers are that seed's "
                     f"alone, the others' the mean of {most})")
    return "\n".join(lines)


def _cell(row: pd.Series, column: str, fmt: str) -> str:
    if column == "_range":
        if row["seeds"] < 2:
            return "-"
        return f"{row['slo_min'] * 100:.1f}-{row['slo_max'] * 100:.1f}"
    value = row[column]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(int(value) if fmt == "{:d}" else value)


def recommendation(ranked: pd.DataFrame) -> str:
    """One line: the first candidate, and its margin over the runner-up."""
    if ranked.empty:
        return "recommendation: none (no run finished)"
    first = ranked.iloc[0]
    line = (f"recommendation: {first['layout']} with policy {first['policy']}: SLO attainment "
            f"{first['slo_attainment']:.1%}, goodput {first['goodput_turns_s']:.2f} turns/s, "
            f"turn-2+ TTFT p90 {first['turn2plus_ttft_ms_p90']:.0f} ms, TPOT p90 "
            f"{first['tpot_ms_p90']:.1f} ms")
    if len(ranked) < 2:
        return line + " (the only candidate)"
    second = ranked.iloc[1]
    return line + (f"; over the runner-up {second['layout']} {second['policy']}: "
                   f"{_points(first, second)} attainment, goodput "
                   f"{_relative(first['goodput_turns_s'], second['goodput_turns_s'])}, "
                   f"turn-2+ TTFT p90 "
                   f"{_relative(first['turn2plus_ttft_ms_p90'], second['turn2plus_ttft_ms_p90'])}")


def _points(first: pd.Series, second: pd.Series) -> str:
    return f"{(first['slo_attainment'] - second['slo_attainment']) * 100:+.1f} points"


def _relative(value: Any, base: Any) -> str:
    if base is None or value is None or not base or math.isnan(base) or math.isnan(value):
        return "-"
    return f"{(value - base) / abs(base) * 100:+.1f}%"


def warnings(ranked: pd.DataFrame, rows: pd.DataFrame) -> list[str]:
    """Why the ranking may not hold: too few conversations, ranges that overlap, one seed."""
    out = []
    fewest = rows["n_conversations"].min() if not rows.empty else 0
    if fewest < MIN_CONVERSATIONS:
        out.append(f"too small a sample to rank: a run holds {int(fewest)} conversations "
                   f"(fewer than {MIN_CONVERSATIONS}); raise --duration")
    if len(ranked) < 2:
        return out
    first, second = ranked.iloc[0], ranked.iloc[1]
    if first["seeds"] < 2 or second["seeds"] < 2:
        out.append("the first two ran on one seed: no range to tell them apart (use --seeds 3)")
    elif first["slo_min"] <= second["slo_max"]:
        out.append(f"too close to call: the first two's SLO attainment over "
                   f"{int(first['seeds'])} seeds overlap ({_range(first)} vs {_range(second)}); "
                   "the runner-up is as good a choice at this sample (raise --duration or "
                   "--seeds to separate them)")
    return out


def _range(row: pd.Series) -> str:
    return f"{row['slo_min'] * 100:.1f}-{row['slo_max'] * 100:.1f}%"
