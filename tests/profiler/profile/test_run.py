"""`Profiler.run` end to end against the real proxy in front of fake vLLM nodes.

P is made slow on cue, so forcing turn 2 to `pd` must measure a higher TTFT than forcing it
to `local`; the table written must say so, and a second run must resume (measure nothing).
"""

from __future__ import annotations

from pathlib import Path

from profiler.profile.runner import ProfileGrid, Profiler
from profiler.tables.io import read_table
from proxy import ProxyConfig, create_app
from proxy.config.cluster_file import NodeSpec
from proxy.policies.table import DecisionTable
from proxy.serving.server import running
from proxy.shared.discretize import Cell, ContextClass
from proxy.shared.vocabulary import Role, RouteKind
from tests.fakes.fake_vllm import FakeVLLM

P_DELAY_S = 0.15
GRID = ProfileGrid(contexts=(ContextClass.SMALL,), workloads=("tiny", "big_paste"), qps=(16.0,),
                   duration_s=0.4, warmup_conversations=1, timeout_s=10)


def _user_turns(body: dict) -> int:
    return sum(1 for message in body.get("messages", []) if message.get("role") == "user")


async def test_profile_measures_both_routes_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "table.csv"
    async with FakeVLLM("p") as p, FakeVLLM("d", chunk_delay_s=0.002) as d:
        p.faults.delay_s = P_DELAY_S
        config = ProxyConfig(nodes=(NodeSpec(p.url, Role.PREFILL), NodeSpec(d.url, Role.DECODE)),
                             port=0, admin_key="adm")
        async with running(create_app(config)) as proxy:
            seen: list[Cell] = []
            profiler = Profiler(grid=GRID, target=proxy.url, out_csv=out, meta={"model": "m"},
                                seed=3, progress=False, admin_key="adm",
                                on_cell=lambda cell, row: seen.append(cell))
            frame = await profiler.run()

            assert sorted(seen) == sorted(GRID.cells())
            assert len(frame) == 2
            for row in frame.itertuples():
                assert row.pd_success == 1.0 and row.local_success == 1.0
                # P's delay sits in front of every pd turn 2 and of no local one.
                assert row.pd_ttft_ms > row.local_ttft_ms + P_DELAY_S * 1000 * 0.5
                assert row.n_requests >= 1
            # Turn-2 requests reached P only in the pd runs: P saw a 2-user-message prompt
            # exactly as often as the pd columns counted turn-2 requests (plus warm-ups).
            p_turn2 = sum(_user_turns(r.body) == 2 for r in p.completions)
            pd_turn2 = int(frame["pd_n_requests"].sum()) + GRID.warmup_conversations * 2
            assert p_turn2 == pd_turn2

            table = DecisionTable.load(out)
            for cell in GRID.cells():
                assert table.decide(cell, w_ttft=1, w_tpot=0) is RouteKind.LOCAL

            # Resuming: every cell is in the CSV already, so nothing is sent again.
            sent = len(p.completions) + len(d.completions)
            again = await Profiler(grid=GRID, target=proxy.url, out_csv=out, meta={},
                                   seed=3, progress=False, admin_key="adm").run()
            assert len(p.completions) + len(d.completions) == sent
            assert len(again) == 2

    on_disk = read_table(out.with_suffix(".parquet"))
    assert set(on_disk["workload"]) == {"tiny", "big_paste"}
    assert (out.parent / "table.meta.json").is_file()
