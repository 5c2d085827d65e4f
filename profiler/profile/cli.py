"""`ppd profile` command line: flags or a YAML grid -> a Profiler run -> the decision grid.

The table is written after every cell, so an interrupted run (Ctrl-C, SIGTERM) keeps what it
measured and the same command resumes it; a finished table is never overwritten without
--force.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from profiler.cli import HelpFormatter, base_url
from profiler.flags.types import output_file, positive_int, weight
from profiler.profile.grid import ProfileGrid, grid_from_mapping, read_grid_file
from proxy.policies.table import MEASURED, STATUS_COLUMN
from proxy.shared.discretize import TURN1_PROFILES, WORKLOAD_SHAPES
from proxy.shared.redact import redacted_command, redacted_url, rerun_note
from proxy.shared.tokens import TokenCounter, token_counter
from proxy.shared.vocabulary import PRODUCT, Role

INTERRUPTED_EXIT = 130
FAILED_EXIT = 1


def explain_grid() -> str:
    """What x and the grid's axes mean (the epilog of `ppd profile --help`)."""
    shapes = "\n".join(f"    {name:<14} {shape.n_in:>5} new input tokens, {shape.n_out:>5} output"
                       for name, shape in WORKLOAD_SHAPES.items())
    contexts = "\n".join(f"    {context.value:<14} turn 1 of {shape.n_in} input + {shape.n_out} "
                         "output tokens" for context, shape in TURN1_PROFILES.items())
    return f"""\
x is the share of follow-up turns (turn 2+) run locally on the decode node that already holds
the conversation's KV cache: x=0 sends every turn P->D ("pd", prefill on a P node, KV moved
to D), x=1 appends the new input on D ("local", no transfer, but D prefills). The profiler
measures both routes of every cell by forcing turn 2 with the x-ppd-route header.

a cell is (context class, workload shape, request rate):
  context classes (the context D holds before turn 2):
{contexts}
  workload shapes (turn 2, the PPD paper's nine):
{shapes}
  request rates: turns per second sent to the proxy (as `vllm bench serve --request-rate`);
    each profiled conversation has 2 turns, so conversations start at half that rate.

example:
  ppd profile --target http://127.0.0.1:8000 --admin-key ADMIN --out tables/mine.csv \\
      --contexts small --workloads tiny,mid_bal --request-rate 1 --duration 20"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppd profile",
        description="Measure turn-2 TTFT/TPOT of x=0 (pd) and x=1 (local), and with --readback\n"
        "of readback, for every grid cell and write a decision table (CSV + Parquet + meta.json).",
        epilog=explain_grid(),
        formatter_class=HelpFormatter,
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--target", type=base_url,
                       help="base URL (without /v1) of a running ppd proxy in front of a cluster")
    where.add_argument("--cluster", metavar="LAYOUT",
                       help="start a local cluster with this layout (e.g. 1P1D), profile, stop")
    where.add_argument("--backend", choices=["sim"],
                       help="sim: profile a simulated cluster (--layout, --cost) in virtual time")
    parser.add_argument("--layout", help="with --backend sim: the layout, e.g. 1P3D")
    parser.add_argument("--cost", default="h100:llama-3.1-8b",
                        help="with --backend sim: cost preset (default h100:llama-3.1-8b)")
    parser.add_argument("--processes", type=positive_int, default=1,
                        help="with --backend sim: worker processes (default 1)")
    parser.add_argument("--model", help="model to serve with --cluster (tiny|smollm2|DIR); "
                        "with --target, the served model name (default: the first one listed)")
    parser.add_argument("--out", type=output_file, required=True,
                        help="table path (NAME.csv); NAME.parquet and NAME.meta.json go beside")
    parser.add_argument("--force", action="store_true",
                        help="replace a finished table at --out (a partial one is resumed)")
    defaults = ProfileGrid()
    parser.add_argument("--grid", type=Path, help="YAML grid file (keys: contexts, workloads, "
                        "qps [request rates], duration_s, warmup_conversations, timeout_s, "
                        "max_conversations); flags override it")
    parser.add_argument("--contexts", help="comma list of context classes (default: "
                        f"{','.join(c.value for c in defaults.contexts)}; add huge, an 8k-token "
                        "turn 1, for a GPU or simulated cluster)")
    parser.add_argument("--workloads", help="comma list of turn-2 shapes (default: all nine, "
                        "listed below)")
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument("--request-rate", metavar="R[,R...]",
                      help="comma list of load points in requests (turns) per second, the unit "
                      "of the proxy's load meter (default: "
                      f"{','.join(f'{q:g}' for q in defaults.qps)})")
    rate.add_argument("--qps", metavar="R[,R...]", help="deprecated alias of --request-rate")
    parser.add_argument("--duration", type=float, help="seconds per (cell, route) (default: "
                        f"{defaults.duration_s:g})")
    parser.add_argument("--warmup", type=int, help="warm-up conversations per (cell, route) "
                        f"(default: {defaults.warmup_conversations})")
    parser.add_argument("--timeout", type=float, help="per-request timeout in seconds "
                        f"(default: {defaults.timeout_s:g})")
    parser.add_argument("--max-conversations", type=positive_int,
                        help="cap on conversations per (cell, route)")
    parser.add_argument("--tokenizer", type=Path,
                        help="local HF tokenizer dir for exact synthetic token counts")
    parser.add_argument("--seed", type=int, default=0, help="order and text seed")
    parser.add_argument("--admin-key", help="the proxy's admin key (forcing a route needs it)")
    parser.add_argument("--w-ttft", type=weight, default=1.0,
                        help="TTFT weight of the verdicts printed at the end")
    parser.add_argument("--w-tpot", type=weight, default=1.0,
                        help="TPOT weight of the verdicts printed at the end")
    parser.add_argument("--layout-label", default=None,
                        help="layout recorded in meta.json with --target (default: counted "
                        "from the proxy's /health, e.g. 1P1D)")
    parser.add_argument("--hardware-label", default=None,
                        help="hardware recorded in meta.json with --target (default: unknown; "
                        "the proxy cannot see the nodes' hardware)")
    parser.add_argument("--base-port", type=int, default=18400,
                        help="first port of the local cluster (with --cluster)")
    parser.add_argument("--readback", action="store_true",
                        help="measure the third route too: turn 2 forced to `readback` (P reads "
                        "the history's KV back from D; docs/readback.md). Every route's turn 1 "
                        "is then sent whole, not streamed (D names its blocks only in a whole "
                        "answer); the nodes must keep them (`ppd cluster up` does for NIXL)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def grid_from_args(args: argparse.Namespace) -> ProfileGrid:
    values: dict[str, Any] = {}
    if args.grid is not None:
        values.update(read_grid_file(args.grid))
    if args.contexts:
        values["contexts"] = _split(args.contexts)
    if args.workloads:
        values["workloads"] = _split(args.workloads)
    rates = args.request_rate or args.qps
    if args.qps:
        print("ppd profile: warning: --qps is deprecated, use --request-rate (the same "
              "numbers: requests per second)", file=sys.stderr)
    if rates:
        try:
            values["qps"] = [float(q) for q in _split(rates)]
        except ValueError:
            raise ValueError(f"--request-rate takes numbers, got {rates!r}") from None
    for flag, key in (("duration", "duration_s"), ("warmup", "warmup_conversations"),
                      ("timeout", "timeout_s"), ("max_conversations", "max_conversations")):
        if getattr(args, flag) is not None:
            values[key] = getattr(args, flag)
    return grid_from_mapping(values)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def table_files(out: Path) -> tuple[Path, ...]:
    """The files of the table NAME.csv: the CSV, its Parquet twin and its meta."""
    from profiler.tables.io import meta_path

    return (out, out.with_suffix(".parquet"), meta_path(out))


def previous(path: Path) -> Path:
    """Where --force keeps a file of the table it replaces until the new run has finished."""
    return path.with_name(path.name + ".previous")


def set_aside(out: Path) -> None:
    """--force: the table it replaces is renamed, not deleted, so an interrupted run loses
    nothing; a finished run deletes it (`drop_previous`)."""
    for path in table_files(out):
        if path.exists():
            path.rename(previous(path))


def drop_previous(out: Path) -> None:
    for path in table_files(out):
        previous(path).unlink(missing_ok=True)


def check_out_table(out: Path, grid: ProfileGrid, force: bool) -> int:
    """A finished table (every grid cell measured) is replaced only with --force; a partial one
    is resumed (said on stderr). Returns how many rows the run starts from (0: a new table).
    A table set aside by an interrupted --force run (`set_aside`) is never overwritten."""
    kept = [previous(path) for path in table_files(out) if previous(path).exists()]
    if kept:
        raise ValueError(f"{kept[0]} holds the table an interrupted --force run was replacing: "
                         f"rename it back to {out} to keep it, or delete it to measure again")
    if not out.exists():
        return 0
    if force:
        set_aside(out)
        return 0
    from profiler.profile.runner import cell_key, measured_keys
    from profiler.tables.io import read_table

    table = read_table(out)
    done = measured_keys(table)
    wanted = {cell_key(*cell) for cell in grid.cells()}
    if wanted <= done:
        raise ValueError(f"{out} already holds every cell of this grid (a finished profile); "
                         "pass --force to measure it again, or choose another --out")
    print(f"ppd profile: resuming {out}: {len(wanted & done)} of {len(wanted)} cells already "
          "measured", file=sys.stderr)
    return len(table)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not (args.target or args.cluster or args.backend):
        raise ValueError("say where to profile: --target URL, --cluster LAYOUT or --backend sim")
    grid = grid_from_args(args)
    if args.out.suffix != ".csv":
        raise ValueError("--out names the CSV (NAME.csv); Parquet and meta.json go beside it")
    resumed = check_out_table(args.out, grid, args.force)
    tokenizer = _load_tokenizer(args.tokenizer)
    started = time.monotonic()
    command = redacted_command([PRODUCT, "profile", *argv], secrets=(args.admin_key,))
    from profiler.cluster.procs import sigterm_as_interrupt

    try:
        with sigterm_as_interrupt():  # SIGTERM too: say how to resume
            frame = _profile(args, grid, tokenizer, command)
    except KeyboardInterrupt:
        print(interrupt_message(args.out, command), file=sys.stderr)
        if previous(args.out).exists():
            print(f"ppd profile: the table this --force run was replacing is kept as "
                  f"{previous(args.out)} (rename it back to {args.out} to keep it)",
                  file=sys.stderr)
        return INTERRUPTED_EXIT
    drop_previous(args.out)
    new = len(frame) - resumed
    already = f"; {resumed} cells were already in the table (resumed)" if resumed else ""
    print(f"profiled {new} cells in {time.monotonic() - started:.0f} s{already} -> {args.out}")
    from profiler.tables.cli import render_decisions

    print(render_decisions(args.out, w_ttft=args.w_ttft, w_tpot=args.w_tpot))
    if STATUS_COLUMN in frame and not (frame[STATUS_COLUMN] == MEASURED).any():
        # A table of gaps: the proxy would send every turn P->D, as if nothing were profiled.
        print(f"ppd profile: failed: no cell of {args.out} was measured (the requests of "
              "every cell failed; the warnings above name the first errors)", file=sys.stderr)
        return FAILED_EXIT
    return 0


def interrupt_message(out: Path, command: str) -> str:
    """What a stopped run kept, and the command that resumes it (secrets shown as ***)."""
    from profiler.tables.io import read_table

    again = f"Run the same command again to resume:\n  {command}{rerun_note(command)}"
    if not out.exists():
        return (f"ppd profile: interrupted before the first cell was finished: no table was "
                f"written yet ({out} does not exist). {again}")
    return (f"ppd profile: interrupted; the {len(read_table(out))} cells measured so far are "
            f"in {out}. {again}")


def _profile(args: argparse.Namespace, grid: ProfileGrid, tokenizer: TokenCounter | None,
             command: str) -> Any:
    if args.backend == "sim":
        from profiler.profile.on_simulator import profile_from_args

        return profile_from_args(args, grid, command)
    if args.cluster:
        from profiler.profile.on_cluster import ClusterProfileJob, profile_on_local_cluster

        job = ClusterProfileJob(
            layout=args.cluster, out=args.out, model=args.model or "tiny", seed=args.seed,
            w_ttft=args.w_ttft, w_tpot=args.w_tpot, base_port=args.base_port,
            progress=not args.no_progress, command=command, readback=args.readback)
        return profile_on_local_cluster(job, grid, tokenizer)
    return asyncio.run(_profile_target(args, grid, tokenizer, command))


def _load_tokenizer(path: Path | None) -> TokenCounter | None:
    # None: the --cluster run counts with the served model's tokenizer once it is prepared.
    return None if path is None else token_counter(path)


async def _profile_target(args: argparse.Namespace, grid: ProfileGrid,
                          tokenizer: TokenCounter | None, command: str) -> Any:
    # The runner (pandas, numpy) once the flags are known to be good.
    from profiler.profile.probe import check_forced_route, check_keeps_blocks
    from profiler.profile.runner import PROFILED_ROUTES, WITH_READBACK, Profiler
    from profiler.replay.client import first_model
    from profiler.tables.io import build_meta

    async with httpx.AsyncClient(base_url=args.target, timeout=grid.timeout_s) as client:
        model = args.model or await first_model(client)
        # Before any cell: a target that does not force routes would give a table that lies.
        await check_forced_route(client, model, args.admin_key)
        if args.readback:  # D keeps blocks only under a policy that reads them back
            await check_keeps_blocks(client)
        layout = args.layout_label or await reported_layout(client)
    from profiler.emulate.label import emulated_backend, emulation_of

    preset = await asyncio.to_thread(emulation_of, args.target)
    meta = build_meta(
        model=model, layout=layout,
        backend=emulated_backend(preset) if preset else "vllm (remote, via proxy)",
        grid=grid.as_meta(), weights={"w_ttft": args.w_ttft, "w_tpot": args.w_tpot},
        extra={"command": command, "target": redacted_url(args.target),
               **({"emulated": preset} if preset else {})},
    )
    # build_meta describes this machine; with --target the nodes are elsewhere.
    meta["hardware"] = args.hardware_label or (f"emulated ({preset})" if preset else "unknown")
    profiler = Profiler(grid=grid, target=args.target, out_csv=args.out, meta=meta,
                        seed=args.seed, model=model, tokenizer=tokenizer,
                        admin_key=args.admin_key, progress=not args.no_progress,
                        routes=WITH_READBACK if args.readback else PROFILED_ROUTES)
    return await profiler.run()


async def reported_layout(client: httpx.AsyncClient) -> str:
    """The layout the proxy reports at /health (`1P2D`, `2R`), or 'unknown'."""
    try:
        response = await client.get("/health")
        nodes = response.json().get("nodes", [])
        roles = [str(node["role"]) for node in nodes]
    except (httpx.HTTPError, ValueError, AttributeError, KeyError, TypeError):
        return "unknown"
    n_p, n_d, n_r = (roles.count(role) for role in Role)
    if n_p or n_d:
        return f"{n_p}P{n_d}D" + (f"+{n_r}R" if n_r else "")
    return f"{n_r}R" if n_r else "unknown"


async def served_model(target: str) -> str:
    """The first model the proxy lists (the served model name the table records)."""
    from profiler.replay.client import first_model

    async with httpx.AsyncClient(base_url=target, timeout=10) as client:
        return await first_model(client)
