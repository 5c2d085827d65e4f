"""The token definition (text-v1): counters, a turn's new input, requested output, usage."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.shared.completion import Captured
from proxy.shared.tokens import (
    TOKEN_DEFINITION,
    EstimateTokenCounter,
    HFTokenCounter,
    TokenCounter,
    TokenizerError,
    new_input_tokens,
    requested_output_tokens,
    token_counter,
    turn_usage,
)
from tests.proxy.helpers import make_tokenizer


def test_hf_counts_text_exactly_from_a_dir_or_its_file(tmp_path: Path) -> None:
    directory = make_tokenizer(tmp_path / "tok")
    for counter in (HFTokenCounter(directory), token_counter(directory / "tokenizer.json")):
        assert counter.count("hello world") == 2
        assert counter.count("") == 0
        assert counter.truncate("hello world how are you", 2) == "hello world"
        assert counter.truncate("hello", 5) == "hello"
        assert isinstance(counter, TokenCounter)


def test_bad_tokenizer_dirs(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        HFTokenCounter(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot load"):
        HFTokenCounter(tmp_path)


def test_estimate_is_four_chars_per_token() -> None:
    counter = token_counter(None)
    assert isinstance(counter, EstimateTokenCounter)
    assert (counter.count("x" * 40), counter.count("x" * 41)) == (10, 11)
    assert counter.truncate("x" * 41, 10) == "x" * 40


def test_new_input_is_the_text_of_what_d_does_not_hold(tmp_path: Path) -> None:
    # The directory has a chat template; text-v1 ignores it (no role markers, no BOS).
    counter = HFTokenCounter(make_tokenizer(tmp_path / "tok"))
    messages = [{"role": "user", "content": "hello world"},
                {"role": "assistant", "content": "how are you"},
                {"role": "user", "content": [{"type": "text", "text": "today"},
                                             {"type": "image_url", "image_url": {"url": "x"}}]},
                {"role": "user", "content": None}]
    assert new_input_tokens(counter, {"messages": messages}, 0, chat=True) == 6
    assert new_input_tokens(counter, {"messages": messages}, 2, chat=True) == 1
    prompt = {"prompt": "hello world how are you"}
    assert new_input_tokens(counter, prompt, len("hello world"), chat=False) == 3
    assert new_input_tokens(counter, {"prompt": [1, 2, 3]}, 0, chat=False) == 3
    assert new_input_tokens(counter, {"prompt": [1, 2, 3]}, 2, chat=False) == 1
    assert TOKEN_DEFINITION == "text-v1"


def test_requested_output_prefers_max_completion_tokens() -> None:
    assert requested_output_tokens({"max_completion_tokens": 7, "max_tokens": 9}) == 7
    assert requested_output_tokens({"max_tokens": 9}) == 9
    assert requested_output_tokens({}) is None


def _captured(text: str, reasoning: str = "", usage: dict | None = None) -> Captured:
    return Captured(text, reasoning, usage, "stop", True)


def test_turn_usage_takes_vllms_report_and_leaves_the_reasoning_out_of_the_context() -> None:
    counter = EstimateTokenCounter()
    plain = turn_usage(counter, _captured("x" * 8, usage={"prompt_tokens": 100,
                                                           "completion_tokens": 20}), 0)
    assert (plain.completion_tokens, plain.held_tokens) == (20, 120)
    # The next turn's history does not carry the reasoning, so D's reusable context does not.
    reported = {"prompt_tokens": 100, "completion_tokens": 20,
                "completion_tokens_details": {"reasoning_tokens": 15}}
    thought = turn_usage(counter, _captured("x" * 20, "y" * 60, reported), 0)
    assert (thought.completion_tokens, thought.held_tokens) == (20, 105)
    counted = turn_usage(counter, _captured("x" * 20, "y" * 60, {"prompt_tokens": 100,
                                                                "completion_tokens": 20}), 0)
    assert counted.held_tokens == 100 + 20 - 15
    # Without usage: the estimate of the prompt, and the counted reply and reasoning.
    bare = turn_usage(counter, _captured("x" * 20, "y" * 60), 50)
    assert (bare.completion_tokens, bare.held_tokens) == (20, 55)
