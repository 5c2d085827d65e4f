"""Token counting: a local HF tokenizer with its chat template, and the documented estimate."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.tokens import (
    MESSAGE_OVERHEAD_TOKENS,
    EstimateTokenCounter,
    HFTokenCounter,
    TokenizerError,
    token_counter,
)
from tests.proxy.helpers import make_tokenizer


def test_hf_counts_text_exactly(tmp_path: Path) -> None:
    counter = HFTokenCounter(make_tokenizer(tmp_path / "tok"))
    assert counter.count_text("hello world") == 2
    assert counter.count_text("") == 0


@pytest.mark.parametrize("as_file", [False, True])
def test_hf_renders_the_chat_template(tmp_path: Path, as_file: bool) -> None:
    counter = HFTokenCounter(make_tokenizer(tmp_path / "tok", as_jinja_file=as_file))
    assert counter.has_chat_template
    messages = [{"role": "user", "content": "hello world"}]
    rendered = "<s><|user|>hello world<|end|><|assistant|>"
    assert counter.count_chat(messages) == counter.count_text(rendered)
    two = [*messages, {"role": "assistant", "content": "how are you"}]
    assert counter.count_chat(two) > counter.count_chat(messages)


def test_hf_without_template_counts_text_plus_overhead(tmp_path: Path) -> None:
    counter = HFTokenCounter(make_tokenizer(tmp_path / "tok", template=None))
    assert not counter.has_chat_template
    assert counter.count_chat([{"role": "user", "content": "hello world"}]) == (
        2 + MESSAGE_OVERHEAD_TOKENS)


def test_template_that_raises_falls_back_to_text_plus_overhead(tmp_path: Path) -> None:
    strict = ("{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}"
              "{% endif %}")
    counter = HFTokenCounter(make_tokenizer(tmp_path / "tok", template=strict))
    assert counter.count_chat([{"role": "user", "content": "hello"}]) == (
        1 + MESSAGE_OVERHEAD_TOKENS)


def test_bad_tokenizer_dirs(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        HFTokenCounter(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot load"):
        HFTokenCounter(tmp_path)


def test_estimate_is_four_chars_per_token_plus_message_overhead() -> None:
    counter = EstimateTokenCounter()
    assert counter.count_text("x" * 40) == 10
    assert counter.count_text("x" * 41) == 11
    assert counter.count_chat([{"role": "user", "content": "x" * 40},
                               {"role": "assistant", "content": None}]) == (
        10 + 2 * MESSAGE_OVERHEAD_TOKENS)
    assert isinstance(token_counter(None), EstimateTokenCounter)
