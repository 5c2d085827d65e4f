"""`ppd table show|plot`: what a decision table decides for given weights.

The decision itself comes from proxy.table, the very code the proxy runs, so what `show` prints
is what the proxy will do with the same table and weights.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from profiler.tables.io import read_table
from proxy.discretize import WORKLOAD_SHAPES, Cell, ContextClass
from proxy.table import DecisionTable


def decision_frame(path: Path, *, w_ttft: float, w_tpot: float) -> pd.DataFrame:
    """One row per cell: the measurements, the score and the route the proxy would take."""
    frame = read_table(path)
    table = DecisionTable.load(path)
    scores, routes = [], []
    for row in frame.itertuples(index=False):
        cell = Cell(ContextClass(row.context_class), str(row.workload), float(row.qps))
        scores.append(table.score(cell, w_ttft=w_ttft, w_tpot=w_tpot))
        decided = table.decide(cell, w_ttft=w_ttft, w_tpot=w_tpot)
        routes.append(decided.value if decided is not None else "missing")
    frame = frame.assign(score=scores, route=routes)
    return frame


def render_decisions(path: Path, *, w_ttft: float, w_tpot: float) -> str:
    """The decision grid as text: per context class, workloads x qps, 'route (score)'."""
    frame = decision_frame(path, w_ttft=w_ttft, w_tpot=w_tpot)
    lines = [f"decision table {path} (w_ttft={w_ttft:g}, w_tpot={w_tpot:g}; "
             "score = w_ttft*dTTFT - w_tpot*dTPOT, local iff score > 0)"]
    shape_order = {name: index for index, name in enumerate(WORKLOAD_SHAPES)}
    for context, part in frame.groupby("context_class", sort=False):
        part = part.assign(
            label=[f"{route} ({score:+.2f})" if pd.notna(score) else f"{route} (n/a)"
                   for route, score in zip(part["route"], part["score"], strict=True)]
        )
        grid = part.pivot(index="workload", columns="qps", values="label")
        grid = grid.sort_index(key=lambda index: index.map(lambda n: shape_order.get(n, 99)))
        grid.columns = [f"qps={qps:g}" for qps in grid.columns]
        local = int((part["route"] == "local").sum())
        lines += ["", f"context {context}: local in {local}/{len(part)} cells",
                  grid.fillna("-").to_string()]
    return "\n".join(lines)


def plot_decisions(path: Path, out_dir: Path, *, w_ttft: float, w_tpot: float) -> list[Path]:
    """One heatmap PNG per context class: score by workload x qps (positive = local)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = decision_frame(path, w_ttft=w_ttft, w_tpot=w_tpot)
    out_dir.mkdir(parents=True, exist_ok=True)
    shape_order = {name: index for index, name in enumerate(WORKLOAD_SHAPES)}
    written = []
    for context, part in frame.groupby("context_class", sort=False):
        grid = part.pivot(index="workload", columns="qps", values="score")
        grid = grid.sort_index(key=lambda index: index.map(lambda n: shape_order.get(n, 99)))
        limit = float(max(abs(grid.min().min()), abs(grid.max().max()), 1e-9))
        figure, axes = plt.subplots(figsize=(1.6 + 1.2 * grid.shape[1], 1.2 + 0.5 * grid.shape[0]))
        image = axes.imshow(grid.to_numpy(dtype=float), cmap="RdBu", vmin=-limit, vmax=limit,
                            aspect="auto")
        axes.set_xticks(range(grid.shape[1]), [f"{q:g}" for q in grid.columns])
        axes.set_yticks(range(grid.shape[0]), list(grid.index))
        axes.set_xlabel("qps (requests/s)")
        axes.set_title(f"{path.stem}: context {context}\nblue = local (x=1), red = pd (x=0)")
        for (i, j), score in pd.DataFrame(grid.to_numpy()).stack().items():
            axes.text(j, i, f"{score:+.2f}", ha="center", va="center", fontsize=8)
        figure.colorbar(image, ax=axes, label="score")
        figure.tight_layout()
        target = out_dir / f"{path.stem}.{context}.png"
        figure.savefig(target, dpi=120)
        plt.close(figure)
        written.append(target)
    return written


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppd table", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    for name, help_ in (("show", "print the decision grid"), ("plot", "draw heatmaps (PNG)")):
        action = sub.add_parser(name, help=help_)
        action.add_argument("path", type=Path, help="decision table (.csv or .parquet)")
        action.add_argument("--w-ttft", type=float, default=1.0)
        action.add_argument("--w-tpot", type=float, default=1.0)
        if name == "plot":
            action.add_argument("--out", type=Path, default=None,
                                help="output folder (default: beside the table)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "show":
        print(render_decisions(args.path, w_ttft=args.w_ttft, w_tpot=args.w_tpot))
        return 0
    out_dir = args.out or args.path.parent
    for written in plot_decisions(args.path, out_dir, w_ttft=args.w_ttft, w_tpot=args.w_tpot):
        print(written)
    return 0
