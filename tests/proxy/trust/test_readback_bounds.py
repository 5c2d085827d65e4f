"""Issue #45, failures 12 and 13: D's readback params are checked against what the proxy
knows of D before they go to P; the readback book is bounded in bytes and purges what
expired."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from proxy.readback.protocol import HeldKV, held_kv, plausible_params
from proxy.sessions.readback_book import ReadbackBook, entry_bytes

GOOD = {"do_remote_prefill": False, "do_remote_decode": True, "remote_block_ids": [5, 6],
        "remote_engine_id": "d-engine", "remote_request_id": "chatcmpl-1",
        "remote_host": "10.0.0.5", "remote_port": 5601, "remote_num_tokens": 5}


def answer(params: dict[str, Any]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "token_ids": [7, 8, 9]}], "prompt_token_ids": [1, 2, 3],
            "kv_transfer_params": params}


def test_plausible_params_pass() -> None:
    assert held_kv(answer(GOOD), "http://10.0.0.5:8200", 0.0, 60.0) is not None
    assert plausible_params({**GOOD, "remote_block_ids": [[5], [6, 7]]}, "http://d", 5)
    assert plausible_params({**GOOD, "remote_host": "localhost"}, "http://127.0.0.1:1", 5)
    assert plausible_params(GOOD, "http://decode-0.svc:8200", 5)  # a name: not resolved


@pytest.mark.parametrize("change", [
    {"remote_block_ids": list(range(300_000))},  # more blocks than tokens
    {"remote_block_ids": [2**40]},
    {"remote_block_ids": []},
    {"remote_block_ids": [[1]] * 100},
    {"remote_host": "10.6.6.6"},  # another host than D's URL names
    {"remote_host": "evil.example"},
    {"remote_port": 70_000}, {"remote_port": "5601"},
    {"remote_engine_id": "e" * 10_000},
    {"extra": {"nested": [1] * 1000}},
    {f"k{i}": i for i in range(100)},
])
def test_implausible_params_never_reach_p(change: dict[str, Any]) -> None:
    assert held_kv(answer({**GOOD, **change}), "http://10.0.0.5:8200", 0.0, 60.0) is None


def held(tokens: int, expires: float = 1e9) -> HeldKV:
    return HeldKV(dict(GOOD), "http://d", array("q", range(tokens)), expires)


def test_the_book_is_bounded_in_bytes_oldest_first() -> None:
    one = entry_bytes(held(100_000))
    book = ReadbackBook(1000, lambda: 0.0, max_bytes=3 * one)
    for i in range(60):  # 60 sessions of 100k tokens once took 582 MB
        book.put(f"s{i}", "d", held(100_000))
    assert len(book) == 3 and book.bytes <= 3 * one
    assert book.status("s59", "d") is None and book.status("s0", "d") is not None
    assert isinstance(book.take("s59", "d"), HeldKV) and book.bytes <= 2 * one
    book.discard("s58")
    assert book.bytes == one


def test_the_book_purges_expired_entries() -> None:
    now = [0.0]
    book = ReadbackBook(1000, lambda: now[0])
    for i in range(10):
        book.put(f"old{i}", "d", held(10, expires=5.0))
    now[0] = 6.0
    book.put("new", "d", held(10, expires=20.0))
    assert len(book) == 1 and book.bytes == entry_bytes(held(10))
