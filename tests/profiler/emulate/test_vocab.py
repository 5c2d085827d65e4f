"""The emulator's tokenizer: replies of exact token counts that re-encode to the same ids."""

from __future__ import annotations

from profiler.emulate.vocab import Vocabulary


def test_a_reply_re_encodes_to_its_own_ids(vocab: Vocabulary) -> None:
    ids = vocab.reply_ids(200, seed="r1")
    assert len(ids) == 200
    assert vocab.encode_text(vocab.decode(ids)) == ids


def test_replies_are_deterministic_per_seed(vocab: Vocabulary) -> None:
    assert vocab.reply_ids(30, "a") == vocab.reply_ids(30, "a")
    assert vocab.reply_ids(30, "a") != vocab.reply_ids(30, "b")


def test_the_next_turn_starts_with_the_previous_prompt_and_reply(vocab: Vocabulary) -> None:
    """What D's prefix cache holds (turn-1 prompt + reply ids) is a prefix of turn 2's prompt."""
    turn1 = [{"role": "user", "content": "Tell me about rivers and their deltas."}]
    prompt1 = vocab.encode_chat(turn1)
    reply = vocab.reply_ids(40, seed="t1")
    turn2 = [*turn1, {"role": "assistant", "content": vocab.decode(reply)},
             {"role": "user", "content": "And lakes?"}]
    prompt2 = vocab.encode_chat(turn2)
    assert prompt2[: len(prompt1) + len(reply)] == prompt1 + reply
    assert len(prompt2) > len(prompt1) + len(reply)


def test_counts_agree_with_the_proxy_counter(vocab: Vocabulary) -> None:
    """The proxy, given the same directory, counts what the node will report."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    assert vocab.count_chat(messages) == len(vocab.encode_chat(messages))


def test_chat_is_encoded_message_by_message_as_a_whole_would_be(vocab: Vocabulary) -> None:
    """The per-message cache gives the ids of the fully rendered conversation."""
    messages = [{"role": "system", "content": "You answer in French."},
                {"role": "user", "content": "Where is   the\nriver?\n\n"},
                {"role": "assistant", "content": vocab.decode(vocab.reply_ids(9, "z"))},
                {"role": "user", "content": " leading space and trailing  "}]
    rendered = vocab._render(messages, True)
    assert vocab._by_message
    assert vocab.encode_chat(messages) == vocab.encode_text(rendered)
