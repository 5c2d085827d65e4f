"""The emulator's tokenizer: replies of exact token counts that re-encode to the same ids."""

from __future__ import annotations

import jinja2

from profiler.emulate.tokenizer import Vocabulary, render_chat
from profiler.models.prepare import CHATML_TEMPLATE
from proxy.shared.tokens import content_text, token_counter


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
    """The proxy, given the same directory, counts a text as the node tokenizes it."""
    text = "Hi! Where do rivers end?"
    assert token_counter(vocab.directory).count(text) == len(vocab.encode_text(text))


def test_chat_is_encoded_message_by_message_as_a_whole_would_be(vocab: Vocabulary) -> None:
    """The per-message cache gives the ids of the whole rendered conversation, which is what
    the tiny model's own chat template renders."""
    messages = [{"role": "system", "content": "You answer in French."},
                {"role": "user", "content": "Where is   the\nriver?\n\n"},
                {"role": "assistant", "content": vocab.decode(vocab.reply_ids(9, "z"))},
                {"role": "user", "content": [{"type": "text", "text": " parts and  spaces "}]}]
    rendered = render_chat(messages)
    assert vocab.encode_chat(messages) == vocab.encode_text(rendered)
    template = jinja2.Environment().from_string(CHATML_TEMPLATE)
    plain = [{"role": m["role"], "content": content_text(m["content"])} for m in messages]
    assert template.render(messages=plain, add_generation_prompt=True) == rendered
