"""`ppd profile --cluster LAYOUT`: start a local vLLM cluster and a proxy, profile, stop both.

Kept apart from profile/cli.py so profiling a remote proxy (`--target`) never imports the cluster
launcher (and with it the model tooling).
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from profiler.cluster.launcher import default_cores, start_cluster
from profiler.cluster.plan import ClusterConfig, parse_layout
from profiler.cluster.procs import sigterm_as_interrupt
from profiler.profile.runner import PROFILED_ROUTES, WITH_READBACK, ProfileGrid, Profiler
from profiler.tables.io import build_meta, local_vllm_backend
from proxy.policies import pd as pd_policy
from proxy.policies import readback as readback_policy
from proxy.shared.tokens import TokenCounter, token_counter

# The proxy sits above the node ports. Turn 2 is forced per request, so its policy decides
# nothing but whether D keeps a turn's blocks: with --readback it must be one that reads back
# (readback), else no forced readback finds blocks to read (docs/readback.md).
PROXY_PORT_OFFSET = 90
# With --readback, how long D keeps a finished turn's blocks: a profiled turn 2 follows its
# turn 1 within the request timeout (30 s by default), and shorter than vLLM's 480 s so that
# the blocks of conversations already done do not crowd D's cache for the cells after them.
PROFILE_READBACK_TTL_S = 60


@dataclass(frozen=True, slots=True)
class ClusterProfileJob:
    """One `ppd profile --cluster` run: the cluster, the model, and where the table goes.

    command: the command line that rebuilds the table (recorded in its meta).
    """

    layout: str
    out: Path
    model: str = "tiny"
    seed: int = 0
    w_ttft: float = 1.0
    w_tpot: float = 1.0
    base_port: int = 18400
    progress: bool = True
    command: str = ""
    readback: bool = False  # profile the third route too (D keeps blocks only then)


def profile_on_local_cluster(job: ClusterProfileJob, grid: ProfileGrid,
                             tokenizer: TokenCounter | None) -> pd.DataFrame:
    """Profile `grid` on a fresh local cluster of layout job.layout serving job.model."""
    layout = parse_layout(job.layout)
    with tempfile.TemporaryDirectory(prefix="ppd-profile-") as state:
        # One core per node, as `ppd cluster up` does: unpinned, vLLM-CPU's NIXL worker moves
        # every node's model onto the last core (profiler.cluster.cpu_placement).
        # Without --readback D keeps nothing: a pinned block per profiled turn would only
        # shrink D's cache (docs/readback.md, Costs).
        config = ClusterConfig(model=job.model, layout=layout, state_dir=Path(state),
                               base_port=job.base_port, cores=default_cores(),
                               kv_readback_ttl_s=PROFILE_READBACK_TTL_S if job.readback else None)
        # SIGTERM unwinds like Ctrl-C so the nodes and the proxy are stopped, not orphaned.
        with sigterm_as_interrupt(), start_cluster(config, progress=print) as cluster:
            if tokenizer is None and cluster.model_path is not None:
                # Exact token counts for the served model: cells mean what they say.
                tokenizer = token_counter(cluster.model_path)
            # Forcing a route needs an admin key: a fresh one, in a file only this user can
            # read (not on the command line, which every local user can see).
            admin_key = secrets.token_urlsafe(24)
            key_file = Path(state) / "proxy-admin.yaml"
            key_file.touch(mode=0o600)
            key_file.write_text(f"admin_key: {admin_key}\n")
            policy = readback_policy.NAME if job.readback else pd_policy.NAME
            target = cluster.start_proxy(policy, port=job.base_port + PROXY_PORT_OFFSET,
                                         extra_args=["--config", str(key_file)])
            meta = build_meta(
                model=cluster.model, layout=str(layout), backend=local_vllm_backend(),
                grid=grid.as_meta(), weights={"w_ttft": job.w_ttft, "w_tpot": job.w_tpot},
                extra={"command": job.command, "connector": config.connector.value},
            )
            profiler = Profiler(grid=grid, target=target, out_csv=job.out, meta=meta,
                                seed=job.seed, model=cluster.model, tokenizer=tokenizer,
                                progress=job.progress, admin_key=admin_key,
                                routes=WITH_READBACK if job.readback else PROFILED_ROUTES)
            return asyncio.run(profiler.run())
