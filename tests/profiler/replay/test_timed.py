"""Replaying a timed block-hash trace: recorded arrivals, token-id prompts, session ids."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from profiler.cli import main as ppd
from profiler.replay import ReplayConfig
from profiler.replay.timed import replay_timed, timed_turns
from profiler.traces.block_tokens import BlockTokens
from profiler.traces.mooncake import BLOCK_TOKENS, parse_records, timed_requests
from tests.fakes.fake_openai_timed import FakeTimedServer, serve, serve_in_thread

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "datasets" / "samples" / "mooncake_sample.jsonl"


def _records() -> list[dict]:
    def rec(t: int, hashes: list[int], out: int) -> dict:
        return {"timestamp": t, "input_length": len(hashes) * BLOCK_TOKENS - 200,
                "output_length": out, "hash_ids": hashes}
    return [rec(0, [0, 1, 2, 3], 40), rec(100, [0, 9, 8], 20), rec(300, [0, 1, 2, 5, 6], 30)]


async def test_turns_arrive_as_recorded_with_token_ids_and_the_session() -> None:
    tokens = BlockTokens(vocab_size=3072, scale=0.1)
    turns = timed_turns(timed_requests(parse_records(_records())), tokens)
    assert [(t.conversation, t.turn, t.max_tokens) for t in turns] == [
        ("mooncake-0", 1, 4), ("mooncake-1", 1, 2), ("mooncake-0", 2, 3)]
    # the continuation starts with its parent's whole prompt (its three complete blocks of 51
    # tokens at 0.1 and its partial fourth, 31 tokens), so a proxy sees it extend it; then its
    # own ids: its scaled length, its block 5 where a turn-1 prompt with those hashes has it
    parent, child = turns[0].prompt, turns[2].prompt
    assert len(parent) == 3 * 51 + 31 and len(child) == 4 * 51 + 31
    assert child[:len(parent)] == parent
    own = tokens.prompt(parse_records(_records())[2])
    assert child[len(parent):] == own[len(parent):] and child[4 * 51:] == tokens.block(6)[:31]
    app = FakeTimedServer(ttft_s=0.0, itl_s=0.0)
    async with serve(app) as url:
        config = ReplayConfig(target=url, qps=1.0, duration_s=1.0, api="completions")
        result = await replay_timed(turns, config)
    assert all(r.success for r in result.records)
    assert [(r.conversation_id, r.turn) for r in result.records] == [
        ("mooncake-0", 1), ("mooncake-1", 1), ("mooncake-0", 2)]
    # open loop at the recorded times (0, 0.1, 0.3 s), not after the previous reply
    starts = [r.start_s for r in result.records]
    assert starts[1] == pytest.approx(0.1, abs=0.05) and starts[2] == pytest.approx(0.3, abs=0.05)
    assert [body["prompt"] for body in app.bodies] == [t.prompt for t in turns]
    assert all(isinstance(body["prompt"][0], int) for body in app.bodies)
    assert [h["x-session-id"] for h in app.headers] == ["mooncake-0", "mooncake-1", "mooncake-0"]
    assert result.n_conversations == 2


def test_ppd_replay_takes_the_sample_as_it_is(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with serve_in_thread(FakeTimedServer(ttft_s=0.0, itl_s=0.0)) as url:
        code = ppd(["replay", "--target", url, "--dataset", str(SAMPLE), "--start", "10",
                    "--duration", "20", "--time-scale", "20", "--scale-tokens", "0.05",
                    "--vocab-size", "3072", "--out", str(out), "--no-progress"])
    assert code == 0
    frame = pd.read_csv(out / "requests.csv")
    recorded = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    expected = sum(10_000 <= r["timestamp"] < 30_000 for r in recorded)
    assert len(frame) == expected and frame["success"].all()
    # 20 s of trace at 20x: about 1 s (a loaded machine adds some), far below the 20 s
    assert frame["start_ms"].max() <= 5_000


@pytest.mark.parametrize("extra, message", [
    ([], "give --vocab-size N"),
    (["--vocab-size", "3072", "--api", "chat"], "drop --api chat"),
    (["--vocab-size", "3072", "--conversation-rate", "1"], "drop --conversation-rate"),
    (["--vocab-size", "3072", "--time-scale", "0"], "--time-scale must be > 0"),
    (["--vocab-size", "3072", "--scale-tokens", "1.5"], "--scale-tokens must be in (0, 1]"),
    (["--vocab-size", "3072", "--start", "5000"], "no request in the window"),
    (["--vocab-size", "3072", "--max-context-tokens", "100"], "fits --max-context-tokens 100"),
])
def test_bad_timed_flags_are_one_clear_error(extra: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", "--target", "http://127.0.0.1:9", "--dataset", str(SAMPLE),
            "--duration", "10", *extra]
    assert ppd(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("ppd replay: error:") and message in err, err


def test_a_conversation_dataset_still_needs_a_rate(capsys: pytest.CaptureFixture[str]) -> None:
    assert ppd(["replay", "--target", "http://127.0.0.1:9", "--dataset", "synthetic:mixed",
                "--duration", "1"]) == 1
    assert "--conversation-rate R is required" in capsys.readouterr().err
