"""The vLLM P/D wire bodies, exactly as docs/architecture.md ("Wire protocol") describes them."""

from __future__ import annotations

import re

from proxy.upstream.pd_protocol import decode_body, local_body, prefill_body, request_id


def test_prefill_body() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100,
            "max_completion_tokens": 100, "stream": True, "stream_options": {"a": 1},
            "min_tokens": 5, "min_completion_tokens": 5, "temperature": 0.3}
    out = prefill_body(body)
    assert out == {"model": "m", "messages": body["messages"], "max_tokens": 1,
                   "max_completion_tokens": 1, "stream": False, "temperature": 0.3,
                   "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                          "remote_engine_id": None, "remote_block_ids": None,
                                          "remote_host": None, "remote_port": None}}
    assert body["max_tokens"] == 100 and "stream_options" in body  # the original is untouched


def test_prefill_body_adds_no_max_completion_tokens_when_absent() -> None:
    assert "max_completion_tokens" not in prefill_body({"prompt": "x"})
    assert prefill_body({"prompt": "x"})["max_tokens"] == 1


def test_decode_body_copies_p_params_only_when_present() -> None:
    body = {"prompt": "x", "stream": True}
    params = {"remote_engine_id": "e", "remote_block_ids": [1]}
    assert decode_body(body, params) == {**body, "kv_transfer_params": params}
    assert decode_body(body, None) == body
    assert "kv_transfer_params" not in body


def test_local_body_is_the_client_body() -> None:
    body = {"prompt": "x", "max_tokens": 7}
    assert local_body(body) == {"prompt": "x", "max_tokens": 7}


def test_a_client_written_kv_transfer_params_reaches_no_leg() -> None:
    rogue = {"remote_host": "evil.example", "remote_port": 1, "remote_block_ids": [9]}
    body = {"prompt": "x", "kv_transfer_params": rogue}
    assert "kv_transfer_params" not in local_body(body)
    assert "kv_transfer_params" not in decode_body(body, None)
    assert decode_body(body, {"remote_engine_id": "p"})["kv_transfer_params"] == {
        "remote_engine_id": "p"}
    assert prefill_body(body)["kv_transfer_params"]["remote_host"] is None
    assert body["kv_transfer_params"] is rogue  # the client's body is left alone


def test_request_ids() -> None:
    legacy = request_id("10.0.0.1:21001", "10.0.0.2:22001")
    assert re.fullmatch(r"___prefill_addr_10\.0\.0\.1:21001___decode_addr_10\.0\.0\.2:22001_"
                        r"[0-9a-f]{32}", legacy)
    assert request_id() != request_id()
    assert request_id("a:1", None).startswith("ppd-")
