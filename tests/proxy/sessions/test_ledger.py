"""The session ledger: continuation, branches, equal first messages, TTL and LRU."""

from __future__ import annotations

from typing import Any

from proxy.sessions.ledger import SessionLedger
from proxy.sessions.session import Transcript
from tests.proxy.helpers import FakeClock


def msgs(*contents: str, system: str | None = None) -> list[dict[str, Any]]:
    roles = ("user", "assistant")
    out = [{"role": "system", "content": system}] if system else []
    return out + [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]


def serve(ledger: SessionLedger, messages: list[dict[str, Any]], reply: str,
          explicit: str | None = None) -> tuple[str, int]:
    """Resolve and complete one chat turn; (session id, turn)."""
    transcript = Transcript.from_chat(messages)
    lookup = ledger.resolve(transcript, explicit)
    turn = lookup.turn
    ledger.record_turn(lookup, transcript.held_after(reply, 10 * (len(messages) + 1)))
    return lookup.session.id, turn


def test_chat_continuation_by_content_hash() -> None:
    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    sid, turn = serve(ledger, msgs("Hi", system="sys"), "Hello!")
    assert turn == 1
    sid2, turn2 = serve(ledger, msgs("Hi", "Hello!", "How are you?", system="sys"), "Fine.")
    assert (sid2, turn2) == (sid, 2)
    lookup = ledger.resolve(Transcript.from_chat(
        msgs("Hi", "Hello!", "How are you?", "Fine.", "Bye", system="sys")))
    assert lookup.continuation and lookup.turn == 3
    assert lookup.cached_tokens == 50  # what serve() recorded for the 4-message turn


def test_echoed_assistant_message_with_extra_fields_still_continues() -> None:
    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    serve(ledger, msgs("Hi"), "Hello!")
    history = msgs("Hi") + [{"role": "assistant", "content": "Hello!", "refusal": None,
                             "tool_calls": None}, {"role": "user", "content": "More"}]
    assert ledger.resolve(Transcript.from_chat(history)).continuation


def test_edited_history_is_a_new_branch_at_turn_1() -> None:
    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    serve(ledger, msgs("Hi"), "Hello!")
    sid, turn = serve(ledger, msgs("Hi", "Something else", "Next"), "ok")
    assert turn == 1
    lookup = ledger.resolve(Transcript.from_chat(msgs("Hi", "Something else", "Next", "ok", "x")))
    assert lookup.continuation and lookup.session.id == sid and lookup.turn == 2


def test_two_users_with_the_same_first_message_keep_their_own_conversations() -> None:
    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    a, _ = serve(ledger, msgs("Hi"), "Hello A")
    b, turn_b = serve(ledger, msgs("Hi"), "Hello B")
    assert turn_b == 1 and a != b
    a2, turn_a2 = serve(ledger, msgs("Hi", "Hello A", "a?"), "A2")
    b2, turn_b2 = serve(ledger, msgs("Hi", "Hello B", "b?"), "B2")
    assert (a2, turn_a2) == (a, 2)
    assert (b2, turn_b2) == (b, 2)
    # A third user whose history matches neither is not a continuation of either.
    lookup = ledger.resolve(Transcript.from_chat(msgs("Hi", "Hello C", "c?")))
    assert not lookup.continuation and lookup.session.id not in (a, b)


def test_new_branch_starts_on_its_siblings_nodes() -> None:
    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    transcript = Transcript.from_chat(msgs("Hi"))
    lookup = ledger.resolve(transcript)
    lookup.session.decode, lookup.session.prefill = "http://d", "http://p"
    ledger.record_turn(lookup, transcript.held_after("Hello", 5))
    branch = ledger.resolve(Transcript.from_chat(msgs("Hi", "Edited", "x")))
    assert not branch.continuation
    assert (branch.session.decode, branch.session.prefill) == ("http://d", "http://p")


def test_explicit_id_needs_matching_content_to_continue() -> None:
    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    serve(ledger, msgs("Hi"), "Hello", explicit="conv-1")
    sid, turn = serve(ledger, msgs("Hi", "Hello", "next"), "r", explicit="conv-1")
    assert (sid, turn) == ("conv-1", 2)
    # Same id, but a history that does not extend what D holds: a branch, turn 1.
    assert ledger.resolve(Transcript.from_chat(msgs("Other", "x", "y")), "conv-1").turn == 1
    # Same content under another id is another conversation.
    assert ledger.resolve(Transcript.from_chat(msgs("Hi", "Hello", "next", "r", "z")),
                          "conv-2").turn == 1


def test_repeating_the_same_prompt_is_not_a_continuation() -> None:
    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    serve(ledger, msgs("Hi", "Hello", "q"), "a", explicit="c")
    assert not ledger.resolve(Transcript.from_chat(msgs("Hi", "Hello", "q", "a")), "c").continuation


def test_completions_continue_when_the_prompt_extends_prompt_plus_reply() -> None:
    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    t1 = Transcript.from_prompt("User: hi\nAssistant:")
    lookup = ledger.resolve(t1)
    ledger.record_turn(lookup, t1.held_after(" Hello!", 7))
    t2 = Transcript.from_prompt("User: hi\nAssistant: Hello!\nUser: more\nAssistant:")
    second = ledger.resolve(t2)
    assert second.continuation and second.session.id == lookup.session.id and second.turn == 2
    assert second.cached_tokens == 7
    t3 = Transcript.from_prompt("User: hi\nAssistant: Bonjour\nUser: more\nAssistant:")
    assert not ledger.resolve(t3).continuation


def test_batch_prompts_never_continue() -> None:
    # (A prompt of token ids does: tests/proxy/sessions/test_token_transcript.py.)
    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    t1 = Transcript.from_prompt([[1, 2, 3]])
    lookup = ledger.resolve(t1)
    ledger.record_turn(lookup, t1.held_after("x", 3))
    assert not ledger.resolve(Transcript.from_prompt([[1, 2, 3, 4, 5]])).continuation


def test_idle_sessions_expire_after_the_ttl() -> None:
    clock = FakeClock(1000.0)
    ledger = SessionLedger(ttl=60, max_sessions=100, clock=clock)
    serve(ledger, msgs("Hi"), "Hello", explicit="c")
    clock.now += 59
    assert ledger.get("c") is not None
    clock.now += 59  # touched by nothing since: idle for 118 s
    assert ledger.get("c") is None
    assert len(ledger) == 0


def test_lru_eviction_drops_the_least_recently_used() -> None:
    clock = FakeClock(1000.0)
    ledger = SessionLedger(ttl=3600, max_sessions=2, clock=clock)
    for name in ("a", "b"):
        serve(ledger, msgs(name), "r", explicit=name)
        clock.now += 1
    serve(ledger, msgs("a", "r", "more"), "r2", explicit="a")  # a is now the newest
    clock.now += 1
    serve(ledger, msgs("c"), "r", explicit="c")
    assert ledger.get("b") is None
    assert ledger.get("a") is not None and ledger.get("c") is not None
    assert len(ledger) == 2


def test_hash_index_forgets_evicted_branches() -> None:
    clock = FakeClock(1000.0)
    ledger = SessionLedger(ttl=3600, max_sessions=1, clock=clock)
    serve(ledger, msgs("Hi"), "A")
    serve(ledger, msgs("Hi"), "B")  # evicts the first
    assert len(ledger) == 1
    assert not ledger.resolve(Transcript.from_chat(msgs("Hi", "A", "x"))).continuation


def test_any_number_of_conversations_with_one_opening_continue() -> None:
    # A fixed system prompt plus "Hi": more conversations than any bounded scan would look at.
    ledger = SessionLedger(3600, 10_000, FakeClock(1000.0))
    ids = [serve(ledger, msgs("Hi", system="You are helpful."), f"Hello {i}")[0]
           for i in range(200)]
    assert len(set(ids)) == 200
    for i in range(200):
        sid, turn = serve(ledger, msgs("Hi", f"Hello {i}", "more", system="You are helpful."),
                          f"r{i}")
        assert (sid, turn) == (ids[i], 2)


def test_completions_with_one_opening_continue_their_own_branch() -> None:
    ledger = SessionLedger(3600, 10_000, FakeClock(1000.0))
    opening = "System: be brief\nUser: hi\nAssistant:"
    ids = []
    for i in range(50):
        t = Transcript.from_prompt(opening)
        lookup = ledger.resolve(t)
        ledger.record_turn(lookup, t.held_after(f" reply number {i}" + "!" * i, 5))
        ids.append(lookup.session.id)
    for i in (0, 17, 49):
        t = Transcript.from_prompt(f"{opening} reply number {i}{'!' * i}\nUser: more\nAssistant:")
        lookup = ledger.resolve(t)
        assert lookup.continuation and lookup.session.id == ids[i] and lookup.turn == 2


def test_a_reused_conversation_id_with_another_opening_keeps_both_sessions() -> None:
    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    serve(ledger, msgs("Alice here"), "Hi Alice", explicit="chat-1")
    other, turn = serve(ledger, msgs("Bob here"), "Hi Bob", explicit="chat-1")
    assert turn == 1 and other.startswith("chat-1~")
    # Both continue their own conversation, under the id they both sent.
    assert serve(ledger, msgs("Alice here", "Hi Alice", "more"), "a", explicit="chat-1") == (
        "chat-1", 2)
    assert serve(ledger, msgs("Bob here", "Hi Bob", "more"), "b", explicit="chat-1") == (other, 2)


def test_a_turn_that_lost_the_race_is_not_recorded() -> None:
    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    serve(ledger, msgs("Hi"), "Hello", explicit="c")
    t = Transcript.from_chat(msgs("Hi", "Hello", "next"))
    first, second = ledger.resolve(t, "c"), ledger.resolve(t, "c")
    assert ledger.record_turn(first, t.held_after("one", 9)) is not None
    assert ledger.record_turn(second, t.held_after("two", 9)) is None
    stored = ledger.get("c")
    assert stored is not None and stored.turns == 2
    assert Transcript.from_chat(msgs("Hi", "Hello", "next", "one", "x")).continues(stored.held)


# ---- issue 23, items 3 and 4 ----

def test_a_history_that_does_not_continue_an_id_forks_and_never_replaces_it() -> None:
    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    assert serve(ledger, msgs("A's opening"), "A's reply", explicit="v2") == ("v2", 1)
    # B: A's opening and a forged reply under the same id: a branch of its own, at turn 1.
    forged, turn = serve(ledger, msgs("A's opening", "forged", "B asks"), "B's reply",
                         explicit="v2")
    assert turn == 1 and forged != "v2"
    # A's real turn 2 still continues A's session, and B's branch continues too.
    lookup = ledger.resolve(Transcript.from_chat(msgs("A's opening", "A's reply", "A asks")),
                            "v2")
    assert (lookup.session.id, lookup.turn, lookup.cached_tokens) == ("v2", 2, 20)
    lookup = ledger.resolve(Transcript.from_chat(
        msgs("A's opening", "forged", "B asks", "B's reply", "more")), "v2")
    assert (lookup.session.id, lookup.turn) == (forged, 2)


def test_identical_histories_all_continue_on_their_second_turn() -> None:
    # 20 conversations, same system prompt and opening, identical (greedy) replies.
    ledger = SessionLedger(3600, 1000, FakeClock(1000.0))
    system = "You are terse."
    for _ in range(20):
        serve(ledger, msgs("Hi", system=system), "Hello.")
    # One after the other ...
    for i in range(10):
        t = Transcript.from_chat(msgs("Hi", "Hello.", f"question {i}", system=system))
        lookup = ledger.resolve(t)
        assert (lookup.continuation, lookup.turn, lookup.cached_tokens) == (True, 2, 30), i
        assert ledger.record_turn(lookup, t.held_after(f"answer {i}", 50)) is not None
    # ... and all at once: every one continues (routes local); the index keeps them all.
    transcripts = [Transcript.from_chat(msgs("Hi", "Hello.", f"q{i}", system=system))
                   for i in range(10, 20)]
    lookups = [ledger.resolve(t) for t in transcripts]
    assert all(lk.continuation and lk.turn == 2 for lk in lookups)
    for t, lk in zip(transcripts, lookups, strict=True):
        ledger.record_turn(lk, t.held_after("a", 50))
    third = ledger.resolve(Transcript.from_chat(
        msgs("Hi", "Hello.", "question 3", "answer 3", "more", system=system)))
    assert (third.continuation, third.turn) == (True, 3)


def test_a_new_branch_under_a_used_id_does_not_start_on_its_nodes() -> None:
    # Where a branch lands (x-ppd-decode) must not tell a client that an id is in use.
    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    t = Transcript.from_chat(msgs("opening"))
    lookup = ledger.resolve(t, "used")
    lookup.session.decode = "http://d1"
    ledger.record_turn(lookup, t.held_after("reply", 10))
    probe = ledger.resolve(Transcript.from_chat(msgs("opening", "guess", "more")), "used")
    assert (probe.continuation, probe.session.decode, probe.session.prefill) == (False, None, None)


def test_the_index_keeps_a_bounded_number_of_points_per_session() -> None:
    from proxy.sessions.ledger import POINTS_PER_SESSION

    ledger = SessionLedger(3600, 100, FakeClock(1000.0))
    history = ["Hi"]
    for i in range(3 * POINTS_PER_SESSION):
        serve(ledger, msgs(*history), f"r{i}")
        history += [f"r{i}", f"q{i}"]
    assert len(ledger) == 1
    assert len(ledger._held) == POINTS_PER_SESSION  # noqa: SLF001 - the bound is the point
    latest = ledger.resolve(Transcript.from_chat(msgs(*history)))
    assert latest.continuation and latest.turn == 3 * POINTS_PER_SESSION + 1
