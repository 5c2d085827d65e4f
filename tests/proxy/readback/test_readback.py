"""proxy.readback.protocol: what D's answer says it keeps, what P is told to read, what the client
sees."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.readback.protocol import (
    EXPIRY_MARGIN_S,
    client_answer,
    held_kv,
    matched_tokens,
    prefill_params,
    tokenize_body,
    tokenized_ids,
)
from proxy.shared.validate import Endpoint

D_PARAMS = {"do_remote_prefill": False, "do_remote_decode": True, "remote_block_ids": [[5, 6]],
            "remote_engine_id": "d-engine", "remote_request_id": "chatcmpl-1",
            "remote_host": "127.0.0.1", "remote_port": 5601, "remote_num_tokens": 5,
            "remote_blocks_expiry_time": 123.0}


def answer(params: Any = D_PARAMS, prompt: Any = (1, 2, 3), output: Any = (7, 8, 9)
           ) -> dict[str, Any]:
    return {"id": "x", "choices": [{"index": 0, "message": {"content": "hi"},
                                    "token_ids": None if output is None else list(output)}],
            "usage": {"prompt_tokens": 3}, "kv_transfer_params": params,
            "prompt_token_ids": None if prompt is None else list(prompt)}


def test_held_kv_keeps_ds_params_and_the_ids_its_blocks_hold() -> None:
    held = held_kv(answer(), "http://d1", now=100.0, ttl=60.0)
    assert held is not None
    assert held.params == D_PARAMS and held.decode == "http://d1"
    assert list(held.token_ids) == [1, 2, 3, 7, 8]  # remote_num_tokens of prompt + reply
    assert held.expires == 100.0 + 60.0 - EXPIRY_MARGIN_S


@pytest.mark.parametrize("bad", [
    answer(params=None),  # bidirectional off: D names nothing
    answer(params={**D_PARAMS, "do_remote_decode": False}),
    answer(params={**D_PARAMS, "remote_block_ids": []}),  # nothing kept
    answer(params={k: v for k, v in D_PARAMS.items() if k != "remote_host"}),
    answer(params={**D_PARAMS, "remote_num_tokens": 0}),
    answer(params={**D_PARAMS, "remote_num_tokens": 7}),  # more than the ids D reported
    answer(prompt=None),  # no ids: nothing to check the next prompt against
    answer(output=None),
    answer(output=["a"]),
    "not a dict",
])
def test_held_kv_refuses_what_it_cannot_check(bad: Any) -> None:
    assert held_kv(bad, "http://d1", 0.0, 60.0) is None


def test_matched_tokens_is_the_common_prefix_and_leaves_p_its_last_token() -> None:
    assert matched_tokens([1, 2, 3, 4], [1, 2, 9, 4, 5]) == 2
    assert matched_tokens([1, 2, 3], [1, 2, 3, 4, 5]) == 3
    assert matched_tokens([1, 2, 3], [1, 2, 3]) == 2  # P must compute at least one token
    assert matched_tokens([], [1]) == 0
    assert matched_tokens([5], [1, 2]) == 0


@given(st.lists(st.integers(0, 3), max_size=700), st.lists(st.integers(0, 3), max_size=700))
def test_matched_tokens_agrees_with_a_plain_scan(held: list[int], new: list[int]) -> None:
    n = 0
    while n < min(len(held), len(new) - 1) and held[n] == new[n]:
        n += 1
    assert matched_tokens(held, new) == n


def test_prefill_params_are_ds_own_reading_only_the_matched_tokens() -> None:
    held = held_kv(answer(), "http://d1", 0.0, 60.0)
    assert held is not None
    assert prefill_params(held, 4) == {**D_PARAMS, "remote_num_tokens": 4}
    assert held.params["remote_num_tokens"] == 5  # the kept params are not changed


def test_client_answer_drops_the_ids_and_ds_params() -> None:
    out = client_answer(answer())
    assert "kv_transfer_params" not in out and "prompt_token_ids" not in out
    assert out["choices"] == [{"index": 0, "message": {"content": "hi"}}]
    assert out["usage"] == {"prompt_tokens": 3}


def test_tokenize_body_renders_as_p_will() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
            "chat_template_kwargs": {"enable_thinking": False}, "stream": True, "tools": []}
    assert tokenize_body(Endpoint.CHAT, body) == {
        "model": "m", "messages": body["messages"], "tools": [],
        "chat_template_kwargs": {"enable_thinking": False}}
    assert tokenize_body(Endpoint.COMPLETIONS, {"model": "m", "prompt": "p", "n": 2}) == {
        "model": "m", "prompt": "p"}


def test_tokenized_ids() -> None:
    assert tokenized_ids({"count": 2, "tokens": [4, 5]}) == [4, 5]
    assert tokenized_ids({"tokens": ["a"]}) is None
    assert tokenized_ids(None) is None
