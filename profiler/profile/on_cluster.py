"""`ppd profile --cluster LAYOUT`: start a local vLLM cluster and a proxy, profile, stop both.

Kept apart from profile.py so profiling a remote proxy (`--target`) never imports the cluster
launcher (and with it the model tooling).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from profiler.cluster.launcher import start_cluster
from profiler.cluster.plan import ClusterConfig, parse_layout
from profiler.cluster.procs import sigterm_as_interrupt
from profiler.profile.runner import ProfileGrid, Profiler
from profiler.tables.io import build_meta, local_vllm_backend

# The proxy sits above the node ports; its policy is irrelevant (turn 2 is forced per request).
PROXY_PORT_OFFSET = 90


def profile_on_local_cluster(
    args: argparse.Namespace, grid: ProfileGrid, tokenizer: Any
) -> pd.DataFrame:
    """Profile `grid` on a fresh local cluster of layout args.cluster serving args.model."""
    layout = parse_layout(args.cluster)
    model = args.model or "tiny"
    with tempfile.TemporaryDirectory(prefix="ppd-profile-") as state:
        config = ClusterConfig(model=model, layout=layout, state_dir=Path(state),
                               base_port=args.base_port)
        # SIGTERM unwinds like Ctrl-C so the nodes and the proxy are stopped, not orphaned.
        with sigterm_as_interrupt(), start_cluster(config, progress=print) as cluster:
            if tokenizer is None and cluster.model_path is not None:
                # Exact token counts for the served model: cells mean what they say.
                from profiler.traces.tokenizer import load_tokenizer

                tokenizer = load_tokenizer(cluster.model_path)
            target = cluster.start_proxy("pd", port=args.base_port + PROXY_PORT_OFFSET)
            meta = build_meta(
                model=cluster.model, layout=str(layout), backend=local_vllm_backend(),
                grid=grid.as_meta(), weights={"w_ttft": args.w_ttft, "w_tpot": args.w_tpot},
                extra={"command": "ppd profile " + " ".join(_command_words(args))},
            )
            profiler = Profiler(grid=grid, target=target, out_csv=args.out, meta=meta,
                                seed=args.seed, model=cluster.model, tokenizer=tokenizer,
                                progress=not args.no_progress)
            return asyncio.run(profiler.run())


def _command_words(args: argparse.Namespace) -> list[str]:
    """The flags that shaped this run, for the meta file (how to rebuild the table)."""
    words = ["--cluster", args.cluster, "--model", args.model or "tiny", "--out", str(args.out)]
    for flag in ("grid", "contexts", "workloads", "request_rate", "qps", "duration", "warmup",
                 "timeout", "max_conversations", "seed"):
        value = getattr(args, flag)
        if value is not None:
            words += [f"--{flag.replace('_', '-')}", str(value)]
    return words
