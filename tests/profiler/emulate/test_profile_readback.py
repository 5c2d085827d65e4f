"""`ppd profile --readback` through a real proxy in front of emulated nodes that keep a turn's
blocks (docs/readback.md): every route's turn 1 goes whole, turn 2 forced to readback is served
as readback (not a P->D fallback), and the table it writes decides among three routes."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

from profiler.cluster.plan import cluster_document, parse_layout
from profiler.emulate.presets import resolve
from profiler.emulate.serve import HostThread
from profiler.emulate.tokenizer import Vocabulary
from profiler.profile.runner import WITH_READBACK, ProfileGrid, Profiler
from proxy import ServerThread, config_from_args, create_app
from proxy.policies.table import DecisionTable
from proxy.shared.discretize import ContextClass
from proxy.shared.vocabulary import Role


def test_a_readback_profile_measures_the_third_route(tmp_path: Path, vocab: Vocabulary) -> None:
    preset = resolve("linear", "llama-3.1-8b")
    with HostThread(preset, [(Role.PREFILL, 0), (Role.DECODE, 0)], vocab=vocab,
                    readback_ttl_s=60.0) as host:
        doc = cluster_document("llama-3.1-8b", parse_layout("1P1D"),
                               [(n.role, n.url, 0, tmp_path / "log") for n in host.nodes])
        (tmp_path / "cluster.json").write_text(json.dumps(doc))
        config = config_from_args(["--cluster", str(tmp_path / "cluster.json"), "--port", "0",
                                   "--kv-readback-ttl", "60", "--admin-key", "k",
                                   # D keeps blocks only under a policy that reads back;
                                   # the profiler's forced routes override it.
                                   "--policy", "readback"])
        with ServerThread(create_app(config)) as proxy:
            grid = ProfileGrid(contexts=(ContextClass.SMALL,), workloads=("tiny",), qps=(2.0,),
                               duration_s=2.0, warmup_conversations=0, timeout_s=30.0)
            profiler = Profiler(grid=grid, target=proxy.url, out_csv=tmp_path / "t.csv",
                                meta={"model": "llama-3.1-8b"}, progress=False,
                                admin_key="k", routes=WITH_READBACK)
            frame = asyncio.run(profiler.run())
    row = frame.iloc[0]
    # Latencies count only turns served by the forced route: a readback that fell back to
    # P->D (no blocks named, because turn 1 streamed) would leave the readback columns NaN.
    assert math.isfinite(row["readback_ttft_ms"]) and row["readback_success"] == 1.0
    assert row["readback_n_requests"] >= 1
    table = DecisionTable.load(tmp_path / "t.csv")
    assert table.has_readback
