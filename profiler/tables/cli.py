"""`ppd table show|plot`: what a decision table decides for given weights.

The decision itself comes from proxy.policies.table, the very code the proxy runs, so what `show`
prints
is what the proxy will do with the same table and weights. Load points are request rates
(requests, i.e. turns, per second: the unit of the proxy's load meter).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from profiler.cli import HelpFormatter
from profiler.flags.types import weight
from profiler.tables.io import read_table
from proxy.policies.table import TABLE_ROUTES, DecisionTable
from proxy.shared.discretize import WORKLOAD_SHAPES, Cell, ContextClass
from proxy.shared.vocabulary import RouteKind


def decision_frame(path: Path, *, w_ttft: float, w_tpot: float) -> pd.DataFrame:
    """One row per cell: the measurements, the score and the route the proxy would take; for
    a table with the third route also `readback_score` and `route_readback`, the route of a
    turn whose D keeps the history's blocks for a readback."""
    frame = read_table(path)
    table = DecisionTable.load(path)
    scores, routes, readback_scores, readback_routes = [], [], [], []
    for row in frame.itertuples(index=False):
        cell = Cell(ContextClass(row.context_class), str(row.workload), float(row.qps))
        scores.append(table.score(cell, w_ttft=w_ttft, w_tpot=w_tpot))
        decided = table.decide(cell, w_ttft=w_ttft, w_tpot=w_tpot)
        routes.append(decided.value if decided is not None else "missing")
        measured = table.row(cell)
        readback_scores.append(measured.score(w_ttft, w_tpot, RouteKind.READBACK)
                               if measured is not None else float("nan"))
        with_blocks = table.decide(cell, w_ttft=w_ttft, w_tpot=w_tpot, routes=TABLE_ROUTES)
        readback_routes.append(with_blocks.value if with_blocks is not None else "missing")
    frame = frame.assign(score=scores, route=routes)
    if table.has_readback:
        frame = frame.assign(readback_score=readback_scores, route_readback=readback_routes)
    return frame


def _label(row: pd.Series) -> str:
    """`route (score)`; with the third route, `readback (+0.25) | local` where a turn whose
    D keeps its blocks goes otherwise than one whose D does not."""
    if pd.isna(row["score"]):
        text = f"{row['route']} (unmeasured)"
    else:
        text = f"{row['route']} ({row['score']:+.2f})"
    readback = row.get("route_readback")
    if isinstance(readback, str) and readback != row["route"]:
        score = row["readback_score"] if readback == RouteKind.READBACK else row["score"]
        text = f"{readback} ({score:+.2f}) | {row['route']}"
    return text


def render_decisions(path: Path, *, w_ttft: float, w_tpot: float) -> str:
    """The decision grid as text: per context class, workloads x qps, 'route (score)'."""
    frame = decision_frame(path, w_ttft=w_ttft, w_tpot=w_tpot)
    lines = [f"decision table {path} (w_ttft={w_ttft:g}, w_tpot={w_tpot:g}; "
             "score = w_ttft*dTTFT - w_tpot*dTPOT, local iff score > 0; columns: request "
             "rate in requests/s)"]
    if "route_readback" in frame.columns:
        lines.append("with readback measured: 'A (score) | B' = A for a turn whose D keeps the "
                     "history's blocks, B otherwise; each score is against pd")
    shape_order = {name: index for index, name in enumerate(WORKLOAD_SHAPES)}
    for context, part in frame.groupby("context_class", sort=False):
        part = part.assign(label=[_label(row) for _, row in part.iterrows()])
        grid = part.pivot(index="workload", columns="qps", values="label")
        grid = grid.sort_index(key=lambda index: index.map(lambda n: shape_order.get(n, 99)))
        grid.columns = [f"{qps:g} req/s" for qps in grid.columns]
        local = int((part["route"] == RouteKind.LOCAL.value).sum())
        lines += ["", f"context {context}: local in {local}/{len(part)} cells",
                  grid.fillna("-").to_string()]
    return "\n".join(lines)


def cell_text(route: str, score: float | None) -> str:
    """What a heatmap cell says: the verdict, then the score (colour alone is not enough)."""
    if score is None or pd.isna(score):
        return f"{route}\n(unmeasured)"
    return f"{route}\n{score:+.2f}"


def heatmap_grids(frame: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """Per context class: (scores, cell texts), workloads (the paper's order) x request rate."""
    shape_order = {name: index for index, name in enumerate(WORKLOAD_SHAPES)}
    grids = {}
    for context, part in frame.groupby("context_class", sort=False):
        part = part.assign(text=[cell_text(r, s) for r, s in zip(part["route"], part["score"],
                                                                   strict=True)])

        def ordered(values: str, part: pd.DataFrame = part) -> pd.DataFrame:
            grid = part.pivot(index="workload", columns="qps", values=values)
            return grid.sort_index(key=lambda index: index.map(lambda n: shape_order.get(n, 99)))

        grids[str(context)] = (ordered("score"), ordered("text"))
    return grids


def default_plot_dir(table: Path) -> Path:
    """Beside the table (a profile run's outputs), but never into a source checkout's
    tables/ (the shipped tables): there, runs/tables/."""
    parent = table.resolve().parent
    if parent.name == "tables" and (parent.parent / "pyproject.toml").is_file():
        return Path("runs") / "tables"
    return table.parent


def plot_decisions(path: Path, out_dir: Path, *, w_ttft: float, w_tpot: float) -> list[Path]:
    """One heatmap PNG per context class: the verdict and score in each cell of workload x
    request rate, coloured by score (blue local, red pd), the weights in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = decision_frame(path, w_ttft=w_ttft, w_tpot=w_tpot)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for context, (grid, texts) in heatmap_grids(frame).items():
        values = grid.to_numpy(dtype=float)
        finite = values[~pd.isna(values)]
        limit = float(max(abs(finite).max() if finite.size else 0.0, 1e-9))
        figure, axes = plt.subplots(figsize=(2.2 + 1.3 * grid.shape[1], 1.6 + 0.6 * grid.shape[0]))
        image = axes.imshow(values, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
        axes.set_xticks(range(grid.shape[1]), [f"{q:g}" for q in grid.columns])
        axes.set_yticks(range(grid.shape[0]), list(grid.index))
        axes.set_xlabel("request rate (requests/s)")
        axes.set_title(f"{path.stem}: context {context}, w_ttft={w_ttft:g}, w_tpot={w_tpot:g}\n"
                       "local = x=1 (blue), pd = x=0 (red)", fontsize=9)
        for i in range(texts.shape[0]):
            for j in range(texts.shape[1]):
                text = texts.iat[i, j]
                if not isinstance(text, str):
                    text = "missing"
                strong = not pd.isna(values[i, j]) and abs(values[i, j]) > 0.6 * limit
                axes.text(j, i, text, ha="center", va="center", fontsize=8,
                          color="white" if strong else "black")
        figure.colorbar(image, ax=axes, label="score (> 0: local)")
        figure.tight_layout()
        target = out_dir / f"{path.stem}.{context}.png"
        figure.savefig(target, dpi=120)
        plt.close(figure)
        written.append(target)
    return written


EXAMPLES = {
    "show": "example:\n  ppd table show tables/tiny-cpu-1p1d.csv --w-tpot 2",
    "plot": "example:\n  ppd table plot tables/tiny-cpu-1p1d.csv --out runs/plots",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppd table", description=__doc__.splitlines()[0],
                                     epilog="\n".join(EXAMPLES.values()),
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    for name, help_ in (("show", "print the decision grid"), ("plot", "draw heatmaps (PNG)")):
        action = sub.add_parser(name, help=help_, description=help_, epilog=EXAMPLES[name],
                                formatter_class=HelpFormatter)
        action.add_argument("path", type=Path, help="decision table (.csv or .parquet)")
        action.add_argument("--w-ttft", type=weight, default=1.0,
                            help="weight of the turn's TTFT change (as `ppd proxy --w-ttft`)")
        action.add_argument("--w-tpot", type=weight, default=1.0,
                            help="weight of the TPOT change (as `ppd proxy --w-tpot`)")
        if name == "plot":
            action.add_argument("--out", type=Path, default=None,
                                help="output folder (default: beside the table; runs/tables "
                                "for the tables shipped in the repository's tables/)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "show":
        print(render_decisions(args.path, w_ttft=args.w_ttft, w_tpot=args.w_tpot))
        return 0
    out_dir = args.out or default_plot_dir(args.path)
    for written in plot_decisions(args.path, out_dir, w_ttft=args.w_ttft, w_tpot=args.w_tpot):
        print(written)
    return 0
