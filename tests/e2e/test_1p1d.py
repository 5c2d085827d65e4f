"""Through the proxy on a real 1P1D vLLM cluster (tiny model, CPU, NIXL over UCX/TCP):
turn 1 goes P->D with D pulling P's KV over NIXL; turn 2 under `local` is an append-prefill on
the same D (a kv_consumer) that never touches P; turn 2 under `pd` goes through P again and D
pulls only the blocks it lacks; P holds no KV once D has pulled; streams reach an openai client
intact. Every claim about KV is read from vLLM's /metrics counters and gauges."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from profiler.cluster.launcher import Cluster, cluster_status
from proxy.shared.vocabulary import Role
from tests.e2e.support import (
    EXTERNAL_HITS,
    KV_LEASE_S,
    PREFIX_HITS,
    PROMPT_TOKENS,
    REQUESTS,
    Conversation,
    block_size,
    counters,
    delta,
    filler,
    free_base_port,
    proxy_for,
    wait_for_kv_usage_zero,
)


@pytest.fixture(scope="module")
def p_url(cluster_1p1d: Cluster) -> str:
    return cluster_1p1d.url(Role.PREFILL)


@pytest.fixture(scope="module")
def d_url(cluster_1p1d: Cluster) -> str:
    return cluster_1p1d.url(Role.DECODE)


@pytest.fixture(scope="module")
def local_proxy(cluster_1p1d: Cluster, tiny_model: Path) -> Iterator[str]:
    with proxy_for(cluster_1p1d, "local", tiny_model) as url:
        yield url


@pytest.fixture(scope="module")
def pd_proxy(cluster_1p1d: Cluster, tiny_model: Path) -> Iterator[str]:
    with proxy_for(cluster_1p1d, "pd", tiny_model) as url:
        yield url


def test_cluster_is_healthy_and_serves_the_model(cluster_1p1d: Cluster) -> None:
    health = cluster_status(cluster_1p1d.state_dir)
    assert [(h.role, h.running, h.healthy) for h in health] == [
        ("prefill", True, True), ("decode", True, True)]
    models = httpx.get(f"{cluster_1p1d.url(Role.DECODE)}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


def test_turn1_goes_p_to_d_and_d_pulls_p_kv_over_nixl(local_proxy: str, p_url: str, d_url: str
                                                        ) -> None:
    bs = block_size(d_url)
    p0, d0 = counters(p_url), counters(d_url)
    turn = Conversation(local_proxy, "tiny", "t1-pd").say(filler(500, seed=1))
    dp, dd = delta(p0, counters(p_url)), delta(d0, counters(d_url))

    assert (turn.route, turn.turn, turn.prefill, turn.decode) == ("pd", 1, p_url, d_url)
    assert turn.prompt_tokens > 3 * bs  # several full blocks to move
    assert dp[REQUESTS] == 1 and dp[PROMPT_TOKENS] == turn.prompt_tokens  # P prefilled it
    assert dd[REQUESTS] == 1
    # D computed none of the prompt: NIXL brought the KV of every prompt token from P.
    assert dd[PREFIX_HITS] == 0
    assert dd[EXTERNAL_HITS] == turn.prompt_tokens


def test_turn2_local_is_an_append_prefill_on_the_same_d(
    local_proxy: str, p_url: str, d_url: str
) -> None:
    bs = block_size(d_url)
    chat = Conversation(local_proxy, "tiny", "t2-local")
    first = chat.say(filler(500, seed=2))
    p0, d0 = counters(p_url), counters(d_url)
    second = chat.say(filler(40, seed=22))
    dp, dd = delta(p0, counters(p_url)), delta(d0, counters(d_url))

    assert (second.route, second.turn, second.decode, second.prefill) == ("local", 2, d_url, None)
    assert first.decode == d_url
    assert dp == {REQUESTS: 0, PROMPT_TOKENS: 0, PREFIX_HITS: 0, EXTERNAL_HITS: 0}  # P untouched
    assert dd[REQUESTS] == 1 and dd[PROMPT_TOKENS] == second.prompt_tokens
    cached_history = first.prompt_tokens + first.completion_tokens
    assert dd[PREFIX_HITS] >= cached_history // bs * bs  # D reused the whole history ...
    assert dd[EXTERNAL_HITS] == 0  # ... from its own prefix cache, nothing came from P


def test_turn2_pd_where_d_holds_the_history_pulls_only_the_blocks_d_lacks(
    pd_proxy: str, p_url: str, d_url: str
) -> None:
    bs = block_size(d_url)
    chat = Conversation(pd_proxy, "tiny", "t2-pd")
    first = chat.say(filler(500, seed=3))
    p0, d0 = counters(p_url), counters(d_url)
    # Enough new text to fill blocks beyond what D already caches from turn 1.
    second = chat.say(filler(400, seed=33))
    dp, dd = delta(p0, counters(p_url)), delta(d0, counters(d_url))

    assert first.route == "pd"
    assert (second.route, second.turn, second.prefill, second.decode) == ("pd", 2, p_url, d_url)
    assert dp[REQUESTS] == 1 and dp[PROMPT_TOKENS] == second.prompt_tokens  # P prefilled again
    assert dd[REQUESTS] == 1
    # D found turn 1's blocks in its own cache and pulled only the rest from P.
    assert dd[PREFIX_HITS] >= first.prompt_tokens // bs * bs
    assert 0 < dd[EXTERNAL_HITS] <= second.prompt_tokens - first.prompt_tokens // bs * bs
    assert dd[PREFIX_HITS] + dd[EXTERNAL_HITS] == second.prompt_tokens


def test_p_holds_no_kv_once_d_has_pulled(pd_proxy: str, p_url: str, d_url: str) -> None:
    chat = Conversation(pd_proxy, "tiny", "p-frees")
    chat.say(filler(500, seed=6))
    # D's pull ends with a notification that lets P free the blocks at once, long before the
    # lease (KV_LEASE_S) would.
    waited = wait_for_kv_usage_zero(p_url, timeout_s=KV_LEASE_S - 1)
    print(f"\nP's KV usage back to 0 {waited:.2f} s after the answer")


def _ascii(text: str) -> str:
    """Text without non-ASCII: the random tiny model emits lone UTF-8 byte tokens, which
    vLLM shows as U+FFFD per token but merges or drops in the text, so only ASCII compares."""
    return text.encode("ascii", errors="ignore").decode()


def _stream_client(proxy_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0)


def test_streamed_chat_reaches_an_openai_client_intact(local_proxy: str, d_url: str) -> None:
    client = _stream_client(local_proxy)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": filler(60, seed=4)}],
        max_tokens=24, temperature=0, stream=True, logprobs=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        extra_headers={"x-session-id": "stream-chat"},
    )
    assert raw.headers["x-ppd-route"] == "pd" and raw.headers["x-ppd-decode"] == d_url
    chunks = list(raw.parse())
    assert len({c.id for c in chunks}) == 1
    text, tokens, usage, finish = "", [], None, None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs and choice.logprobs.content:
                tokens += [lp.token for lp in choice.logprobs.content]
            finish = choice.finish_reason or finish
    # Every generated token arrived exactly once, in order, with its text.
    assert usage is not None and usage.completion_tokens == 24
    assert len(tokens) == 24 and _ascii("".join(tokens)) == _ascii(text)
    assert finish == "length"


def test_streamed_completions_reach_an_openai_client_intact(local_proxy: str) -> None:
    client = _stream_client(local_proxy)
    # A transcript-style prompt: the proxy keys completions sessions by the opening up to the
    # first turn separator (here the newline after the user's line).
    prompt = f"User: {filler(60, seed=5)}\nAssistant:"
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt=prompt, max_tokens=24, temperature=0, stream=True, logprobs=1,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    assert raw.headers["x-ppd-route"] == "pd"
    text, tokens, usage = "", [], None
    for chunk in raw.parse():
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs and choice.logprobs.tokens:
                tokens += choice.logprobs.tokens
    assert usage is not None and usage.completion_tokens == 24
    assert len(tokens) == 24 and _ascii("".join(tokens)) == _ascii(text)
    # Turn 2 of the same prompt continues the session on D (append-prefill).
    follow = httpx.post(f"{local_proxy}/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": prompt + text + "\nUser: And then?\nAssistant:",
        "max_tokens": 4})
    assert follow.status_code == 200 and follow.headers["x-ppd-route"] == "local"


def test_proxy_subprocess_in_front_of_the_cluster(cluster_1p1d: Cluster, p_url: str) -> None:
    """`ppd cluster up --with-proxy` path: `ppd proxy --cluster cluster.json` as a process."""
    url = cluster_1p1d.start_proxy("pd", port=free_base_port(1))
    try:
        assert cluster_status(cluster_1p1d.state_dir)[-1].healthy
        turn = Conversation(url, "tiny", "subprocess").say("Hello there, how are you?")
        assert (turn.route, turn.prefill) == ("pd", p_url)
    finally:
        cluster_1p1d.stop_proxy()
    assert not (cluster_1p1d.state_dir / "proxy.json").exists()
