"""Prompts of token ids: a turn that strictly extends the ids D holds continues its session."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from proxy.config.policy_config import Policy
from proxy.sessions.ledger import SessionLedger
from proxy.sessions.session import OPENING_TOKENS, TokenTranscript, Transcript
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import FakeClock, config_for, serve_proxy

FIRST = list(range(1000, 1040))  # 40 ids, longer than an opening


def _ledger() -> SessionLedger:
    return SessionLedger(3600, 100, FakeClock(1000.0))


def _served(ledger: SessionLedger, prompt: list[int], explicit: str | None = None,
            usage_tokens: int = 999) -> tuple[str, int]:
    """Resolve and record one turn; (session id, turn)."""
    transcript = Transcript.from_prompt(prompt)
    lookup = ledger.resolve(transcript, explicit)
    ledger.record_turn(lookup, transcript.held_after("a reply", usage_tokens))
    return lookup.session.id, lookup.turn


def test_a_prompt_extending_the_held_ids_continues_with_the_prompt_as_cached_tokens() -> None:
    ledger = _ledger()
    sid, turn = _served(ledger, FIRST, usage_tokens=60)
    second = ledger.resolve(Transcript.from_prompt(FIRST + [7, 8, 9]))
    assert turn == 1
    assert second.continuation and second.turn == 2 and second.session.id == sid
    # D's share is the held prompt only: the reply's ids (usage's 60 - 40) are not verified.
    assert second.cached_tokens == len(FIRST)
    ledger.record_turn(second, Transcript.from_prompt(FIRST + [7, 8, 9]).held_after("r", 70))
    third = ledger.resolve(Transcript.from_prompt(FIRST + [7, 8, 9, 5]))
    assert third.turn == 3 and third.cached_tokens == len(FIRST) + 3


@pytest.mark.parametrize("prompt", [
    FIRST[:20] + [1] + FIRST[21:] + [7],  # an edited id inside the history
    FIRST,  # the same prompt again: not a strict extension
    FIRST[:-1],  # shorter than what D holds
    [5] + FIRST,  # D's ids, shifted
])
def test_a_prompt_not_extending_the_held_ids_is_a_new_branch(prompt: list[int]) -> None:
    ledger = _ledger()
    _served(ledger, FIRST)
    lookup = ledger.resolve(Transcript.from_prompt(prompt))
    assert not lookup.continuation and lookup.turn == 1 and lookup.cached_tokens == 0


@pytest.mark.parametrize("batch", [
    [[1, 2, 3]], [[1, 2, 3], [4, 5]], ["a b", "c"], [1, True, 3], [1, 2**70], [],
])
def test_a_batch_or_a_list_that_is_not_token_ids_stays_turn_one(batch: list[object]) -> None:
    transcript = Transcript.from_prompt(batch)
    assert not isinstance(transcript, TokenTranscript) and not transcript.extendable
    ledger = _ledger()
    lookup = ledger.resolve(transcript)
    ledger.record_turn(lookup, transcript.held_after("x", 3))
    assert not ledger.resolve(Transcript.from_prompt(batch + batch)).continuation


def test_under_an_explicit_id_the_turn_continues_only_its_own_session() -> None:
    ledger = _ledger()
    sid, _ = _served(ledger, FIRST, explicit="conv-1")
    assert sid == "conv-1"
    again = ledger.resolve(Transcript.from_prompt(FIRST + [1]), "conv-1")
    assert again.continuation and again.turn == 2 and again.session.id == "conv-1"
    # Another id is another namespace, even with the same ids; so is no id at all.
    assert not ledger.resolve(Transcript.from_prompt(FIRST + [1]), "conv-2").continuation
    assert not ledger.resolve(Transcript.from_prompt(FIRST + [1])).continuation


def test_the_opening_is_the_first_ids_and_not_a_string_prompts() -> None:
    a = Transcript.from_prompt(FIRST + [1])
    b = Transcript.from_prompt(FIRST[:OPENING_TOKENS] + [3, 4])
    assert a.opening == b.opening
    assert a.opening != Transcript.from_prompt(FIRST[1:]).opening
    as_text = Transcript.from_prompt("".join(chr(i) for i in FIRST))
    assert as_text.opening != a.opening


def test_prefix_digests_in_one_pass_equal_each_prefix_digest() -> None:
    transcript = Transcript.from_prompt(list(range(300)))
    digests = transcript.prefix_digests([1, 17, 299, 300, 500, 0, 17])
    assert digests == {transcript.prefix_digest(n): n for n in (1, 17, 299)}
    assert transcript.held_after("", 0).digest == Transcript.from_prompt(
        list(range(301))).prefix_digest(300)


_DIGESTS = """
from proxy.sessions.session import Transcript
t = Transcript.from_prompt(list(range(5, 5000, 7)) + [2**62])
print(t.opening, t.prefix_digest(100), t.held_after("r", 1).digest)
"""


def test_digests_are_equal_across_processes() -> None:
    """Several proxies share one session store: every process must hash ids alike."""
    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.add(subprocess.run([sys.executable, "-c", _DIGESTS], env=env, check=True,
                                capture_output=True, text=True).stdout)
    here = Transcript.from_prompt(list(range(5, 5000, 7)) + [2**62])
    assert outs == {f"{here.opening} {here.prefix_digest(100)} "
                    f"{here.held_after('r', 1).digest}\n"}


async def test_turn_two_of_a_token_id_conversation_is_routed_local_through_the_proxy(
        cluster: dict[str, FakeVLLM]) -> None:
    body = {"model": "fake-model", "prompt": FIRST, "max_tokens": 4}
    headers = {"x-session-id": "mooncake-7"}
    async with serve_proxy(config_for(cluster, Policy.LOCAL)) as proxy:
        first = await proxy.client.post("/v1/completions", json=body, headers=headers)
        second = await proxy.client.post("/v1/completions", headers=headers,
                                         json={**body, "prompt": FIRST + [11, 12, 13]})
        edited = await proxy.client.post("/v1/completions", headers=headers,
                                         json={**body, "prompt": [1] + FIRST + [11]})
    assert first.status_code == second.status_code == edited.status_code == 200
    assert (first.headers["x-ppd-turn"], first.headers["x-ppd-route"]) == ("1", "pd")
    assert (second.headers["x-ppd-turn"], second.headers["x-ppd-route"]) == ("2", "local")
    assert second.headers["x-ppd-decode"] == first.headers["x-ppd-decode"]
    assert (edited.headers["x-ppd-turn"], edited.headers["x-ppd-route"]) == ("1", "pd")
