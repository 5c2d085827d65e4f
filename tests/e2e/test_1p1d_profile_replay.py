"""The profiler and replay on a real 1P1D vLLM cluster (tiny model, CPU).

- `ppd profile` measures a 2-cell grid and writes a valid table;
- a proxy running policy ppd on that table routes a turn 2 the way the table says, counted in
  /metrics under the cell it used; with the table rewritten so the other route wins, the turn flips;
- replay through the proxy reports routes that match the policy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from profiler.cluster.launcher import Cluster
from profiler.profile.runner import ProfileGrid, Profiler
from profiler.replay.client import ReplayConfig, replay
from profiler.tables.io import read_table, write_table
from profiler.traces.synthetic import multi_turn_conversations
from proxy import ServerThread, config_from_args, create_app
from proxy.policies.table import DecisionTable
from proxy.shared.discretize import TURN1_PROFILES, Cell, ContextClass
from proxy.shared.tokens import token_counter
from proxy.shared.vocabulary import Role, RouteKind
from tests.e2e.support import Conversation, filler, proxy_for

GRID = ProfileGrid(contexts=(ContextClass.SMALL,), workloads=("tiny", "huge_paste"), qps=(1.0,),
                   duration_s=5.0, warmup_conversations=1, timeout_s=120.0)


@pytest.fixture(scope="module")
def profiled_table(cluster_1p1d: Cluster, tiny_model: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "tiny-1p1d.csv"
    with proxy_for(cluster_1p1d, "pd", tiny_model, "--admin-key", "adm") as url:
        profiler = Profiler(grid=GRID, target=url, out_csv=out, meta={"model": "tiny"},
                            seed=11, model="tiny", tokenizer=token_counter(tiny_model),
                            progress=False, admin_key="adm")
        asyncio.run(profiler.run())
    return out


def test_profile_writes_a_valid_table(profiled_table: Path) -> None:
    frame = read_table(profiled_table)
    assert sorted(frame["workload"]) == ["huge_paste", "tiny"]
    for row in frame.itertuples():
        assert row.pd_success == 1.0 and row.local_success == 1.0
        for value in (row.pd_ttft_ms, row.local_ttft_ms, row.pd_tpot_ms, row.local_tpot_ms):
            assert math.isfinite(value) and value > 0
        assert row.pd_n_requests >= 1 and row.local_n_requests >= 1
    assert len(DecisionTable.load(profiled_table)) == 2
    assert len(DecisionTable.load(profiled_table.with_suffix(".parquet"))) == 2


def _table_decisions(proxy_url: str) -> list[tuple[str, str, str]]:
    """(context_class, workload, route) of every table-decided request, from /metrics."""
    text = httpx.get(f"{proxy_url}/metrics", timeout=10).text
    seen = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ppd_requests_total" and sample.labels["reason"] == "table":
                seen += [(sample.labels["context_class"], sample.labels["workload"],
                          sample.labels["route"])] * int(sample.value)
    return seen


def _forced(table: Path, out: Path, winner: RouteKind) -> Path:
    """The same table with every cell rewritten so that `winner` wins it by a wide margin.

    (Swapping the pd_ and local_ columns does not flip a near-tie: the score normalises by the
    pd side, so a cell can favour the same route both ways round.)
    """
    frame = read_table(table)
    win, lose = ("local_", "pd_") if winner is RouteKind.LOCAL else ("pd_", "local_")
    frame[f"{win}ttft_ms"] = frame[f"{lose}ttft_ms"] / 10
    frame[f"{win}tpot_ms"] = frame[f"{lose}tpot_ms"]
    frame[f"{win}success"] = frame[f"{lose}success"]
    path, _, _ = write_table(frame, out, {"model": "tiny"})
    return path


def _turn2_route(cluster: Cluster, table: Path, tiny_model: Path, seed: int) -> tuple[str, str]:
    """Run a 2-turn chat under policy ppd; return (route taken, route the table says)."""
    config = config_from_args(["--cluster", str(cluster.cluster_file), "--policy", "ppd",
                               "--port", "0", "--tokenizer", str(tiny_model),
                               "--table", str(table)])
    with ServerThread(create_app(config)) as server:
        chat = Conversation(server.url, "tiny", f"ppd-e2e-{seed}", max_tokens=24)
        first = chat.say(filler(60, seed))
        second = chat.say("And then what happened next?")
        decided = _table_decisions(server.url)
    assert (first.route, first.turn) == ("pd", 1)
    assert second.turn == 2
    assert len(decided) == 1, decided
    context, workload, route = decided[0]
    assert route == second.route
    verdict = DecisionTable.load(table).decide(Cell(ContextClass(context), workload, 1.0),
                                               w_ttft=1.0, w_tpot=1.0)
    assert verdict is not None, f"the table lacks cell {context}/{workload}"
    return second.route, verdict.value


def test_ppd_policy_follows_the_table_and_flips_with_it(
        cluster_1p1d: Cluster, tiny_model: Path, profiled_table: Path, tmp_path: Path) -> None:
    # A short question after a short context: the turn-2 cell is (small, tiny), profiled.
    taken, said = _turn2_route(cluster_1p1d, profiled_table, tiny_model, seed=101)
    assert taken == said
    other = RouteKind.PD if taken == RouteKind.LOCAL.value else RouteKind.LOCAL
    forced = _forced(profiled_table, tmp_path / "forced.csv", other)
    taken_forced, said_forced = _turn2_route(cluster_1p1d, forced, tiny_model, seed=202)
    assert said_forced == other.value
    assert taken_forced == other.value


@pytest.fixture(scope="module")
def replay_results(cluster_1p1d: Cluster, tiny_model: Path) -> Iterator[dict[str, pd.DataFrame]]:
    tokenizer = token_counter(tiny_model)
    results = {}
    for index, policy in enumerate(("pd", "local")):
        conversations = multi_turn_conversations(
            TURN1_PROFILES[ContextClass.SMALL], ["tiny", "small_bal"], n_turns=3, count=3,
            seed=500 + index, tokenizer=tokenizer)
        with proxy_for(cluster_1p1d, policy, tiny_model) as url:
            config = ReplayConfig(target=url, qps=2.0, duration_s=1.5, max_conversations=3,
                                  timeout_s=120.0, max_tokens_cap=64, seed=index)
            result = asyncio.run(replay(conversations, config))
        results[policy] = pd.DataFrame([dataclasses.asdict(r) for r in result.records])
    yield results


@pytest.mark.parametrize("policy", ["pd", "local"])
def test_replay_reports_routes_that_match_the_policy(
        replay_results: dict[str, pd.DataFrame], cluster_1p1d: Cluster, policy: str) -> None:
    records = replay_results[policy]
    assert records["success"].all(), records[["turn", "error"]]
    assert set(records["turn"]) == {1, 2, 3}
    assert set(records.loc[records["turn"] == 1, "route"]) == {"pd"}
    assert set(records.loc[records["turn"] >= 2, "route"]) == {policy}
    assert set(records["decode"]) == {cluster_1p1d.url(Role.DECODE)}
    prefill = set(records.loc[records["turn"] >= 2, "prefill"].dropna())
    assert prefill == (set() if policy == "local" else {cluster_1p1d.url(Role.PREFILL)})
