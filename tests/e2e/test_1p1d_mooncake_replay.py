"""`ppd replay` of the shipped Mooncake sample through a ppd proxy in front of a real 1P1D
vLLM-CPU cluster (NIXL): token-id prompts at their recorded (time-scaled) arrivals, every
request answered through P->D, its conversation in x-session-id."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from profiler.cli import main as ppd
from profiler.cluster.launcher import Cluster
from tests.e2e.support import proxy_for

SAMPLE = Path(__file__).resolve().parents[2] / "datasets" / "samples" / "mooncake_sample.jsonl"
MAX_CONTEXT = 4000


@pytest.fixture(scope="module")
def pd_proxy(cluster_1p1d: Cluster, tiny_model: Path) -> Iterator[str]:
    with proxy_for(cluster_1p1d, "pd", tiny_model) as url:
        yield url


def test_the_sample_replays_through_the_proxy(pd_proxy: str, tiny_model: Path,
                                              tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = ppd(["replay", "--target", pd_proxy, "--dataset", str(SAMPLE), "--duration", "8",
                "--time-scale", "4", "--scale-tokens", "0.125", "--max-tokens-cap", "8",
                "--max-context-tokens", str(MAX_CONTEXT), "--tokenizer", str(tiny_model),
                "--out", str(out), "--no-progress"])
    assert code == 0
    frame = pd.read_csv(out / "requests.csv")
    records = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    window = [r for r in records if r["timestamp"] < 8000]
    fitting = [r for r in window if len_scaled(r["input_length"])
               + min(max(round(r["output_length"] * 0.125), 1), 8) <= MAX_CONTEXT]
    assert 0 < len(frame) == len(fitting) < len(window)  # the longest ones do not fit
    assert frame["success"].all(), frame["error"].dropna().tolist()
    assert set(frame["route"]) == {"pd"} and frame["prefill"].notna().all()
    # the prompt the node counted is the scaled one (ids, not text re-tokenised)
    assert sorted(frame["n_input_tokens"]) == sorted(
        len_scaled(r["input_length"]) for r in fitting)
    assert (frame["start_ms"].max() / 1000) < 8 / 4 + 1  # 8 s of trace at 4x


def len_scaled(input_length: int) -> int:
    """The prompt length at scale 0.125: 64 tokens a complete block, the partial one scaled."""
    complete = input_length // 512
    partial = input_length - 512 * complete
    return 64 * complete + (min(max(round(partial * 0.125), 1), 64) if partial else 0)
