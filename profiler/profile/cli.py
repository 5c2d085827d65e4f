"""`ppd profile` command line: flags or a YAML grid -> a Profiler run -> the decision grid."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from profiler.profile.runner import ProfileGrid, Profiler, grid_from_mapping
from profiler.replay.client import first_model
from profiler.tables.io import build_meta
from proxy.tokens import TokenCounter, token_counter


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppd profile",
        description="Measure turn-2 TTFT/TPOT of x=0 (pd) and x=1 (local) for every grid cell "
        "and write a decision table (CSV + Parquet + meta.json).",
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", help="base URL of a running ppd proxy in front of a cluster")
    where.add_argument("--cluster", metavar="LAYOUT",
                       help="start a local cluster with this layout (e.g. 1P1D), profile, stop")
    parser.add_argument("--model", help="model to serve with --cluster (tiny|smollm2|DIR); "
                        "with --target, the served model name (default: the first one listed)")
    parser.add_argument("--out", type=Path, required=True, help="table path (NAME.csv)")
    parser.add_argument("--grid", type=Path, help="YAML grid file (keys: contexts, workloads, "
                        "qps, duration_s, warmup_conversations, timeout_s, max_conversations)")
    parser.add_argument("--contexts", help="comma list of context classes (small,large)")
    parser.add_argument("--workloads", help="comma list of turn-2 shapes (default: all nine)")
    parser.add_argument("--qps", help="comma list of load points in requests (turns) per "
                        "second, the unit of the proxy's load meter (default 0.5,1)")
    parser.add_argument("--duration", type=float, help="seconds per (cell, route)")
    parser.add_argument("--warmup", type=int, help="warm-up conversations per (cell, route)")
    parser.add_argument("--timeout", type=float, help="per-request timeout in seconds")
    parser.add_argument("--max-conversations", type=int,
                        help="cap on conversations per (cell, route)")
    parser.add_argument("--tokenizer", type=Path,
                        help="local HF tokenizer dir for exact synthetic token counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--admin-key", help="the proxy's admin key (forcing a route needs it)")
    parser.add_argument("--w-ttft", type=float, default=1.0, help="weight for the summary")
    parser.add_argument("--w-tpot", type=float, default=1.0, help="weight for the summary")
    parser.add_argument("--layout-label", default=None,
                        help="layout recorded in meta.json with --target (e.g. 1P1D)")
    parser.add_argument("--base-port", type=int, default=18400,
                        help="first port of the local cluster (with --cluster)")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def grid_from_args(args: argparse.Namespace) -> ProfileGrid:
    values: dict[str, Any] = {}
    if args.grid is not None:
        loaded = yaml.safe_load(args.grid.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{args.grid}: a grid file is a YAML mapping")
        values.update(loaded)
    if args.contexts:
        values["contexts"] = _split(args.contexts)
    if args.workloads:
        values["workloads"] = _split(args.workloads)
    if args.qps:
        try:
            values["qps"] = [float(q) for q in _split(args.qps)]
        except ValueError:
            raise ValueError(f"--qps takes numbers, got {args.qps!r}") from None
    for flag, key in (("duration", "duration_s"), ("warmup", "warmup_conversations"),
                      ("timeout", "timeout_s"), ("max_conversations", "max_conversations")):
        if getattr(args, flag) is not None:
            values[key] = getattr(args, flag)
    return grid_from_mapping(values)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    grid = grid_from_args(args)
    if args.out.suffix != ".csv":
        raise ValueError("--out names the CSV (NAME.csv); Parquet and meta.json go beside it")
    tokenizer = _load_tokenizer(args.tokenizer)
    started = time.monotonic()
    if args.cluster:
        from profiler.profile.on_cluster import ClusterProfileJob, profile_on_local_cluster

        job = ClusterProfileJob(
            layout=args.cluster, out=args.out, model=args.model or "tiny", seed=args.seed,
            w_ttft=args.w_ttft, w_tpot=args.w_tpot, base_port=args.base_port,
            progress=not args.no_progress, command=shlex.join(["ppd", "profile", *argv]))
        frame = profile_on_local_cluster(job, grid, tokenizer)
    else:
        model = args.model or asyncio.run(served_model(args.target))
        meta = build_meta(
            model=model, layout=args.layout_label or "unknown",
            backend="vllm (remote, via proxy)", grid=grid.as_meta(),
            weights={"w_ttft": args.w_ttft, "w_tpot": args.w_tpot},
        )
        profiler = Profiler(grid=grid, target=args.target, out_csv=args.out, meta=meta,
                            seed=args.seed, model=model, tokenizer=tokenizer,
                            admin_key=args.admin_key, progress=not args.no_progress)
        frame = asyncio.run(profiler.run())
    print(f"profiled {len(frame)} cells in {time.monotonic() - started:.0f} s -> {args.out}")
    from profiler.tables.cli import render_decisions

    print(render_decisions(args.out, w_ttft=args.w_ttft, w_tpot=args.w_tpot))
    return 0


def _load_tokenizer(path: Path | None) -> TokenCounter | None:
    # None: the --cluster run counts with the served model's tokenizer once it is prepared.
    return None if path is None else token_counter(path)


async def served_model(target: str) -> str:
    """The first model the proxy lists (the served model name the table records)."""
    async with httpx.AsyncClient(base_url=target, timeout=10) as client:
        return await first_model(client)
