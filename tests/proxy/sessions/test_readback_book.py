"""ReadbackBook: one entry per session for its current text, taken once, expired by the clock."""

from __future__ import annotations

from array import array

from proxy.readback.protocol import HeldKV
from proxy.sessions.readback_book import ReadbackBook
from proxy.shared.vocabulary import Reason
from tests.proxy.helpers import FakeClock


def kv(expires: float = 100.0, decode: str = "http://d1") -> HeldKV:
    return HeldKV({"remote_engine_id": "e"}, decode, array("q", [1, 2, 3]), expires)


def test_an_entry_is_taken_once() -> None:
    book = ReadbackBook(10, FakeClock(0.0))
    held = kv()
    book.put("s1", "digest-a", held)
    assert book.status("s1", "digest-a") is None
    assert book.take("s1", "digest-a") is held
    assert book.take("s1", "digest-a") is Reason.READBACK_MISSING
    assert len(book) == 0


def test_another_text_or_session_finds_nothing() -> None:
    book = ReadbackBook(10, FakeClock(0.0))
    book.put("s1", "digest-a", kv())
    assert book.status("s1", "digest-b") is Reason.READBACK_MISSING
    assert book.status("s2", "digest-a") is Reason.READBACK_MISSING
    assert book.status("s1", None) is Reason.READBACK_MISSING
    assert book.take("s1", "digest-b") is Reason.READBACK_MISSING
    assert book.status("s1", "digest-a") is None  # a miss takes nothing


def test_expired_entries_say_so_and_go() -> None:
    clock = FakeClock(0.0)
    book = ReadbackBook(10, clock)
    book.put("s1", "d", kv(expires=50.0))
    clock.now = 50.0
    assert book.status("s1", "d") is Reason.READBACK_EXPIRED
    assert book.take("s1", "d") is Reason.READBACK_EXPIRED
    assert book.take("s1", "d") is Reason.READBACK_MISSING


def test_a_sessions_new_text_replaces_its_old_and_discard_drops_it() -> None:
    book = ReadbackBook(10, FakeClock(0.0))
    book.put("s1", "old", kv())
    book.put("s1", "new", kv())
    assert book.status("s1", "old") is Reason.READBACK_MISSING
    book.discard("s1")
    assert book.status("s1", "new") is Reason.READBACK_MISSING


def test_the_book_is_bounded_oldest_first() -> None:
    book = ReadbackBook(2, FakeClock(0.0))
    for name in ("a", "b", "c"):
        book.put(name, "d", kv())
    assert len(book) == 2
    assert book.status("a", "d") is Reason.READBACK_MISSING
    assert book.status("c", "d") is None
