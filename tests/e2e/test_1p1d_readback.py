"""The readback route on a real 1P1D vLLM cluster (tiny model, CPU, NIXL with
`bidirectional_kv_xfer`, as `ppd cluster up` starts it; docs/readback.md).

A turn 2 forced to `readback`: P reads the history's KV back from D and computes only what
the new prompt adds (P's own `vllm:request_prefill_kv_computed_tokens`), and the reply is the
`pd` route's at temperature 0. Past D's TTL the proxy no longer offers D's blocks: the turn
goes P->D with reason `readback_expired`, not an error.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from profiler.cluster.launcher import Cluster
from proxy.readback.protocol import EXPIRY_MARGIN_S, MIN_READBACK_TOKENS
from proxy.shared.vocabulary import Role
from tests.e2e.support import (
    KV_READBACK_TTL_S,
    Conversation,
    block_size,
    filler,
    proxy_for,
    reasons,
    sample_sum,
)

ADMIN = "readback-admin"
# The proxy's policy: one that reads back, or D keeps nothing for a forced readback
# (docs/readback.md, the keep-blocks rule); the routes are forced, so it decides nothing else.
READS_BACK = "readback"
COMPUTED = "vllm:request_prefill_kv_computed_tokens_sum"  # P's tokens computed, not loaded
MAX_TOKENS = 16


class Forced(Conversation):
    """A conversation whose turns can be forced to a route (with the admin key), watching
    what P at p_url computes for each."""

    def __init__(self, proxy_url: str, p_url: str, session: str) -> None:
        super().__init__(proxy_url, "tiny", session, MAX_TOKENS)
        self.p_url = p_url

    def say_on(self, route: str, text: str) -> tuple[str, int, str, int]:
        """Send the next user message forced to route: (route, prompt tokens, reply, the
        tokens P computed for it)."""
        self.messages.append({"role": "user", "content": text})
        body = {"model": self.model, "messages": self.messages, "max_tokens": self.max_tokens,
                "temperature": 0, "ignore_eos": True}
        before = sample_sum(self.p_url, COMPUTED)
        response = httpx.post(f"{self.proxy_url}/v1/chat/completions", json=body, timeout=120,
                              headers={"x-session-id": self.session, "x-ppd-route": route,
                                       "authorization": f"Bearer {ADMIN}"})
        assert response.status_code == 200, response.text
        data = response.json()
        content = data["choices"][0]["message"]["content"]
        self.messages.append({"role": "assistant", "content": content})
        computed = int(sample_sum(self.p_url, COMPUTED) - before)
        return (response.headers["x-ppd-route"], data["usage"]["prompt_tokens"], content,
                computed)


def _opening(p_url: str, block: int) -> str:
    """A first message whose turn-1 prompt leaves P's prefix cache short of the history by at
    least vLLM's kv_recompute_threshold: P reads only spans that long (else it recomputes)."""
    for words in range(150, 400, 7):
        text = filler(words, seed=31)
        tokens = httpx.post(f"{p_url}/tokenize", json={
            "model": "tiny", "messages": [{"role": "user", "content": text}]}).json()["count"]
        # P caches turn 1's whole blocks; the readback then covers the rest plus the reply.
        if tokens % block + MAX_TOKENS - 1 >= MIN_READBACK_TOKENS:
            return text
    raise AssertionError("no opening leaves a readback span long enough")


def test_turn2_readback_computes_only_the_new_tokens_and_answers_as_pd(
        cluster_1p1d: Cluster, tiny_model: Path) -> None:
    p_url = cluster_1p1d.url(Role.PREFILL)
    block = block_size(p_url)
    opening = _opening(p_url, block)
    with proxy_for(cluster_1p1d, READS_BACK, tiny_model, "--admin-key", ADMIN) as url:
        back, pd = Forced(url, p_url, "readback-a"), Forced(url, p_url, "readback-b")
        _, prompt1, reply1, _ = back.say_on("pd", opening)
        assert pd.say_on("pd", opening)[2] == reply1  # the same history on both routes
        route, prompt2, reply2, computed = back.say_on("readback", "Tell me more, please.")
        pd_route, _, pd_reply2, pd_computed = pd.say_on("pd", "Tell me more, please.")
        gained = reasons(url)
        read = httpx.get(f"{url}/stats").json()["readback"]["tokens"]
    held = prompt1 + MAX_TOKENS - 1  # D keeps the prompt and all but the last reply token
    # On pd, P would compute all but turn 1's whole blocks (its own prefix cache). The second
    # conversation's pd turn 2 computes less: P's cache holds the readback's identical prompt.
    pd_alone = prompt2 - prompt1 // block * block
    print(f"\nturn 2: {prompt2} prompt tokens, D held {held}, P read {read} back (short of "
          f"{held} where the reply re-tokenized into other ids); P computed {computed} on readback "
          f"({pd_alone} on pd from its own cache; {pd_computed} on the identical pd turn after "
          f"it; block {block})")
    assert prompt1 <= read <= held  # the prompt always matches; the reply as far as it does
    assert (route, pd_route) == ("readback", "pd")
    assert computed <= prompt2 - held + block
    assert computed < pd_alone
    assert reply2 == pd_reply2
    assert gained.get(("readback", "forced")) == 1.0


def test_an_expired_readback_goes_pd_with_its_own_reason(
        cluster_1p1d: Cluster, tiny_model: Path) -> None:
    with proxy_for(cluster_1p1d, READS_BACK, tiny_model, "--admin-key", ADMIN) as url:
        chat = Forced(url, cluster_1p1d.url(Role.PREFILL), "readback-expired")
        chat.say_on("pd", filler(200, seed=32))
        time.sleep(KV_READBACK_TTL_S - EXPIRY_MARGIN_S + 0.5)
        route, *_ = chat.say_on("readback", "And after a while?")
        gained = reasons(url)
    assert route == "pd"
    assert gained.get(("pd", "readback_expired")) == 1.0


def test_after_a_local_turn_p_reads_back_the_history_it_never_saw(
        cluster_1p1d: Cluster, tiny_model: Path) -> None:
    # Turn 2 runs on D alone (the proxy asks D to keep its blocks); turn 3 forced to readback:
    # P reads turns 1-2 from D instead of computing the part of them it does not cache.
    p_url = cluster_1p1d.url(Role.PREFILL)
    block = block_size(p_url)
    with proxy_for(cluster_1p1d, READS_BACK, tiny_model, "--admin-key", ADMIN) as url:
        chat = Forced(url, p_url, "readback-after-local")
        _, prompt1, _, _ = chat.say_on("pd", filler(150, seed=33))
        route2, prompt2, _, computed2 = chat.say_on("local", filler(120, seed=34))
        route3, prompt3, _, computed3 = chat.say_on("readback", "One more, please.")
    held = prompt2 + MAX_TOKENS - 1
    pd_alone = prompt3 - prompt1 // block * block  # P caches turn 1's whole blocks only
    print(f"\nturn 3: {prompt3} prompt tokens, D held {held}; P computed {computed3} on "
          f"readback ({pd_alone} on pd from its own cache)")
    assert (route2, computed2) == ("local", 0)
    assert route3 == "readback"
    assert computed3 <= prompt3 - held + block
    assert computed3 < pd_alone
