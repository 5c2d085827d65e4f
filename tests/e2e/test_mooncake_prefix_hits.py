"""A timed block-hash trace's synthesised prompts on a real vLLM-CPU node (tiny model, one
replica): a continuation hits the prefix cache for exactly the blocks its hashes share with
the request it continues, a request sharing only the system block hits that block, and a
request with other hashes hits nothing. Read from vLLM's prefix-cache counter."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.cluster.launcher import Cluster
from profiler.replay import ReplayConfig
from profiler.replay.timed import TimedTurn, replay_timed, timed_turns
from profiler.traces.block_tokens import BlockTokens
from profiler.traces.mooncake import BLOCK_TOKENS, parse_records, timed_requests
from proxy.shared.vocabulary import Role
from tests.e2e.support import PREFIX_HITS, block_size, counters, start_e2e_cluster


@pytest.fixture(scope="module")
def replica(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cluster: Cluster = start_e2e_cluster("1R", tiny_model, tmp_path_factory)
    try:
        yield cluster.url(Role.REPLICA)
    finally:
        cluster.stop()


def _turns(tiny_model: Path, scale: float) -> list[TimedTurn]:
    def rec(t: int, hashes: list[int]) -> dict:
        return {"timestamp": t, "input_length": len(hashes) * BLOCK_TOKENS - 100,
                "output_length": 64, "hash_ids": hashes}
    records = parse_records([
        rec(0, [0, 1, 2, 3, 4, 5]),  # a conversation's first turn: 5 complete blocks
        rec(1000, [0, 1, 2, 3, 4, 10, 11]),  # its continuation: shares the 5 complete blocks
        rec(2000, [0, 20, 21]),  # another conversation: shares the system block 0 only
        rec(3000, [30, 31, 32]),  # other hashes altogether
    ])
    vocab = json.loads((tiny_model / "config.json").read_text())["vocab_size"]
    return timed_turns(timed_requests(records), BlockTokens(vocab_size=vocab, scale=scale))


def _hits_of_each(url: str, turns: list[TimedTurn]) -> list[float]:
    """Each turn sent alone (one after the other), with the node's prefix-cache hits it got."""
    config = ReplayConfig(target=url, qps=1.0, duration_s=1.0, api="completions",
                          timeout_s=120.0, session_header=False)
    hits = []
    for turn in turns:
        before = counters(url)[PREFIX_HITS]
        result = asyncio.run(replay_timed([TimedTurn(turn.conversation, turn.turn, 0.0,
                                                     turn.prompt, turn.max_tokens)], config))
        assert [r.success for r in result.records] == [True], result.records
        assert result.records[0].n_input_tokens == len(turn.prompt)
        hits.append(counters(url)[PREFIX_HITS] - before)
    return hits


def test_a_continuation_hits_the_blocks_its_hashes_share(replica: str, tiny_model: Path) -> None:
    # a trace block scaled to one of vLLM's cache blocks (vLLM-CPU: 128 tokens): the hits
    # are then whole blocks, exactly
    block = block_size(replica)
    turns = _turns(tiny_model, block / BLOCK_TOKENS)
    assert [(t.conversation, t.turn) for t in turns] == [
        ("mooncake-0", 1), ("mooncake-0", 2), ("mooncake-2", 1), ("mooncake-3", 1)]
    assert len(turns[0].prompt) == 5 * block + round((BLOCK_TOKENS - 100) * block / BLOCK_TOKENS)
    first, continuation, shares_system, unrelated = _hits_of_each(replica, turns)
    assert first == 0
    assert continuation == 5 * block  # the five complete blocks, not its new ones
    assert shares_system == block  # block 0, across conversations
    assert unrelated == 0
