"""A timed block-hash trace in the simulator: recorded arrivals, prompts from the hashes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from profiler.simulator.cli import main as sim_main
from profiler.simulator.grid import grid_cells
from profiler.simulator.run import RunSpec, simulate
from profiler.simulator.workload import is_timed_dataset, timed_workload
from profiler.traces.mooncake import BLOCK_TOKENS, TraceWindow
from proxy.config.policy_config import Policy, PolicyConfig

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "datasets" / "samples" / "mooncake_sample.jsonl"


def _trace(tmp_path: Path, records: list[tuple[int, list[int], int]]) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(
        {"timestamp": t, "input_length": len(hashes) * BLOCK_TOKENS - 12,
         "output_length": out, "hash_ids": hashes}) + "\n" for t, hashes, out in records))
    return str(path)


def test_each_request_arrives_at_its_scaled_time_as_its_conversations_turn(
        tmp_path: Path) -> None:
    path = _trace(tmp_path, [(0, [0, 1, 2, 3], 20), (4000, [0, 7, 8], 5),
                             (10_000, [0, 1, 2, 3, 4, 5], 9)])
    assert is_timed_dataset(path) and not is_timed_dataset("synthetic:small-tiny")
    workload = timed_workload(path, TraceWindow(time_scale=2))
    assert [a.at for a in workload.arrivals] == [0.0, 2.0, 5.0]
    assert [workload.names[a.conversation.id] for a in workload.arrivals] == [
        ("mooncake-0", 1), ("mooncake-1", 1), ("mooncake-0", 2)]
    first, _, third = (a.conversation.turns[0] for a in workload.arrivals)
    # the continuation's new tokens: its prompt less the parent's prompt and reply
    assert third.n_user == (6 * BLOCK_TOKENS - 12) - (4 * BLOCK_TOKENS - 12 + 20)
    assert third.max_tokens == 9
    assert first.prompt is not None and third.prompt is not None
    a, b = first.prompt.ids(), third.prompt.ids()
    assert len(b) == 6 * BLOCK_TOKENS - 12
    assert a[:3 * BLOCK_TOKENS] == b[:3 * BLOCK_TOKENS]  # the three complete blocks


def test_a_continuation_hits_its_shared_blocks_and_is_sent_open_loop(
        tmp_path: Path, hand_preset: str) -> None:
    # request 2 continues request 1 but arrives 0.2 s after it, before its 400-token reply
    # ends: it is sent at its time all the same; a third conversation shares block 0 only
    path = _trace(tmp_path, [(0, [0, 1, 2, 3], 400), (200, [0, 1, 2, 3, 9], 4),
                             (60_000, [0, 5, 6], 4)])
    spec = RunSpec(layout="1R", dataset=path, qps=1.0, cost=hand_preset, model="llama-3.1-8b",
                   duration_s=100, policy=PolicyConfig(kind=Policy.REPLICA))
    result = simulate(spec)
    records = {(r.conversation_id, r.turn): r for r in result.records}
    assert set(records) == {("mooncake-0", 1), ("mooncake-0", 2), ("mooncake-2", 1)}
    assert all(r.success for r in result.records)
    second = records[("mooncake-0", 2)]
    assert second.start_s == pytest.approx(0.2)
    assert second.start_s < records[("mooncake-0", 1)].start_s + records[
        ("mooncake-0", 1)].e2e_s
    stats = next(iter(result.node_stats.values()))
    # hits: request 2 reuses request 1's three complete blocks, request 3 block 0 (vLLM's
    # 16-token blocks: whole 512-token blocks are whole cache blocks)
    assert stats["prefix_cache_hits"] >= 3 * BLOCK_TOKENS + BLOCK_TOKENS


def test_ppd_sim_run_takes_a_timed_trace_with_its_time_scale(tmp_path: Path, hand_preset: str,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    out = tmp_path / "run"
    code = sim_main(["run", "--layout", "1P1D", "--dataset", str(SAMPLE), "--time-scale", "4",
                     "--start", "20", "--duration", "8", "--cost", hand_preset,
                     "--model", "llama-3.1-8b", "--out", str(out)])
    assert code == 0
    document = json.loads((out / "summary.json").read_text())
    recorded = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    expected = sum(20_000 <= r["timestamp"] < 28_000 for r in recorded)
    assert document["summary"]["n_requests"] == expected
    assert document["config"]["start_s"] == 20 and document["config"]["qps"] == 4
    # offered: the conversations the window started, per second of the 4x faster run
    offered = document["summary"]["n_conversations"] / (8 / 4)
    shown = f"{offered:.3f}" if offered < 10 else f"{offered:.1f}"
    assert re.search(rf"conversations/s \(offered\) +{re.escape(shown)}\n",
                     capsys.readouterr().out)


@pytest.mark.parametrize("argv, message", [
    (["--dataset", str(SAMPLE), "--conversation-rate", "1"], "its load is --time-scale F"),
    (["--dataset", "synthetic:small-tiny", "--time-scale", "2"], "give --conversation-rate"),
    (["--dataset", str(SAMPLE), "--time-scale", "1", "--start", "-1"], "start must be >= 0"),
])
def test_a_load_that_does_not_fit_the_dataset_is_refused(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from profiler.cli import main as ppd

    assert ppd(["sim", "run", "--layout", "1P1D", *argv]) == 1
    assert message in capsys.readouterr().err


def test_a_grid_runs_a_timed_trace_at_its_time_scales(hand_preset: str) -> None:
    base = RunSpec(layout="1P1D", dataset=str(SAMPLE), qps=1.0, cost=hand_preset)
    cells = grid_cells(["1P1D"], [str(SAMPLE), "synthetic:small-tiny"], [0.5, 8], ["pd"],
                       base, lambda layout: None, time_scales=[1, 2, 4])
    assert [(c.spec.dataset == str(SAMPLE), c.spec.qps) for c in cells] == [
        (True, 1), (True, 2), (True, 4), (False, 0.5), (False, 8)]


def test_the_live_view_rehashes_a_session_whose_history_is_another_list() -> None:
    """A timed trace's next request under a session is a new token list, not an extension of
    the last one: its chain is hashed afresh (a stale chain would misreport residency)."""
    from profiler.simulator.cluster_state import MAX_HELD_LISTS, HistoryHashes

    hashes = HistoryHashes(block_size=4)
    first = list(range(8))
    chain = list(hashes.chain("s", first))
    first.extend(range(8, 12))  # the same list grown: extended, its two blocks kept
    assert hashes.chain("s", first)[:2] == chain and len(hashes.chain("s", first)) == 3
    other = [100, *range(1, 12)]  # another list, first block different
    assert hashes.chain("s", other)[0] != chain[0]
    for key in range(MAX_HELD_LISTS + 1):  # old sessions are let go, chain and list
        hashes.chain(str(key), [key] * 4)
    assert hashes.chain("s", other) == HistoryHashes(4).chain("s", other)


def test_a_recorded_prompt_is_hashed_once_as_the_engines_hash_it() -> None:
    """The simulator hands each node a recorded prompt's block hashes instead of letting it
    hash ~12,000 tokens again (`Request.prompt_hashes`): they must be the engine's own."""
    from profiler.engine.prefix_cache import block_hashes

    workload = timed_workload(str(SAMPLE), TraceWindow(0.0, 60.0, 1.0))
    for arrival in workload.arrivals[:5]:
        prompt = arrival.conversation.turns[0].prompt
        assert prompt is not None
        hashes = prompt.hashes(16)
        assert hashes == tuple(block_hashes(prompt.ids(), 16))
        assert prompt.hashes(16) is hashes  # made once per process
        assert len(prompt.hashes(128)) == len(prompt.ids()) // 128
