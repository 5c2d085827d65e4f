"""Where responses and conversations live: the interface, and the embedded (in-process) store.

What is kept (docs/responses.md): per stored response its `response` object, the input items
of its turn, every item of its chain (earlier turns' input and output, so the next turn is
one read, on any process), and the session the chain runs in; per conversation its object
and its items. Records are JSON bytes. Bounds, the same in both stores:
- `--max-responses`: responses and conversations together; past it the oldest written goes;
- `--response-ttl`: a record is forgotten that long after it was written (a conversation:
  after its last item was added);
- `--max-response-bytes`: one record's size (a response's chain, a conversation's items);
  over it a write is refused (`RecordTooLarge`, 413) and nothing is kept.
A claim marks the first turn that continued a response: a second turn naming the same
previous response is a fork and runs as a session of its own (`proxy.responses.service`).
`RedisResponses` (`proxy.responses.redis_store`) keeps the same records in Redis, shared
by every worker and proxy using it.
"""

from __future__ import annotations

import abc
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.config.settings import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_RESPONSES,
    DEFAULT_RESPONSE_TTL_S,
)
from proxy.shared.errors import PayloadTooLarge, ProxyError
from proxy.shared.json_codec import dumps, loads


class RecordTooLarge(PayloadTooLarge):
    """A response chain or a conversation over `--max-response-bytes`."""

    code = "record_too_large"


class StoreUnavailable(ProxyError):
    """The shared store cannot be reached: stored state can be neither read nor written."""

    status = 503
    type = "server_error"
    code = "response_store_unavailable"


@dataclass(frozen=True, slots=True)
class Bounds:
    """The store's bounds (see the module docstring)."""

    max_records: int = DEFAULT_MAX_RESPONSES
    ttl_s: float = DEFAULT_RESPONSE_TTL_S
    max_record_bytes: int = DEFAULT_MAX_RESPONSE_BYTES


def encode(record: dict[str, Any], bounds: Bounds, what: str) -> bytes:
    """A record as stored, or RecordTooLarge."""
    # A copy of exact size: orjson's bytes keep its 4 KiB write buffer (a 200-byte record
    # held 4 KiB, 20x the documented memory, in the 100,000-response flood test).
    data = memoryview(dumps(record)).tobytes()
    if len(data) > bounds.max_record_bytes:
        raise RecordTooLarge(f"{what} is {len(data)} bytes stored, over the limit of "
                             f"{bounds.max_record_bytes} (--max-response-bytes)")
    return data


class ResponseStore(abc.ABC):
    """Responses, conversations and claims (async: the shared store is across the network)."""

    shared: bool = False  # every process using the same store sees the same records
    bounds: Bounds

    async def start(self) -> None:  # noqa: B027 - nothing to open in this process
        """Open connections (when serving starts)."""

    async def close(self) -> None:  # noqa: B027
        """Close connections (when serving stops)."""

    @abc.abstractmethod
    async def put_response(self, response_id: str, record: dict[str, Any]) -> None:
        """Keep a response's record (RecordTooLarge over the size bound)."""

    @abc.abstractmethod
    async def get_response(self, response_id: str) -> dict[str, Any] | None:
        """A response's record; None when unknown, deleted, expired or evicted."""

    @abc.abstractmethod
    async def delete_response(self, response_id: str) -> bool:
        """Forget a response; whether it was there."""

    @abc.abstractmethod
    async def claim(self, response_id: str, child_id: str) -> bool:
        """Whether child_id is the first turn to continue response_id (it then holds it)."""

    @abc.abstractmethod
    async def release(self, response_id: str, child_id: str) -> None:
        """Give a claim back (the turn that held it failed)."""

    @abc.abstractmethod
    async def put_conversation(self, conversation_id: str, obj: dict[str, Any],
                               items: list[dict[str, Any]]) -> None:
        """Create a conversation with its first items."""

    @abc.abstractmethod
    async def get_conversation(self, conversation_id: str) -> dict[str, Any] | None:
        """A conversation's object; None when unknown or gone."""

    @abc.abstractmethod
    async def conversation_items(self, conversation_id: str) -> list[dict[str, Any]] | None:
        """A conversation's items, oldest first; None when it is unknown or gone."""

    @abc.abstractmethod
    async def append_items(self, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        """Add items to a conversation (RecordTooLarge over the bound); False when it is gone."""

    @abc.abstractmethod
    async def delete_item(self, conversation_id: str, item_id: str) -> bool | None:
        """Remove one item; None when the conversation is gone, False when the item is."""

    @abc.abstractmethod
    async def delete_conversation(self, conversation_id: str) -> bool:
        """Forget a conversation; whether it was there."""

    @abc.abstractmethod
    def live(self) -> int:
        """Records kept now (responses + conversations; the shared store: last count seen)."""


@dataclass(slots=True)
class _Entry:
    expires: float
    data: bytes  # the record (a conversation: its object)
    items: list[bytes] | None = None  # a conversation's items
    size: int = 0  # bytes counted against --max-response-bytes
    claimed_by: str | None = None


class MemoryResponses(ResponseStore):
    """Records in this process, oldest-written first out (an OrderedDict in write order)."""

    def __init__(self, bounds: Bounds, clock: Callable[[], float]) -> None:
        self.bounds = bounds
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def _get(self, key: str) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.expires <= self._clock():
            del self._entries[key]
            return None
        return entry

    def _put(self, key: str, entry: _Entry) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        now = self._clock()
        entries = self._entries
        # Oldest written first: expired ones, then any past the count bound.
        while entries and (len(entries) > self.bounds.max_records
                           or next(iter(entries.values())).expires <= now):
            entries.popitem(last=False)

    async def put_response(self, response_id: str, record: dict[str, Any]) -> None:
        data = encode(record, self.bounds, f"response {response_id}")
        self._put("r:" + response_id, _Entry(self._clock() + self.bounds.ttl_s, data,
                                             size=len(data)))

    async def get_response(self, response_id: str) -> dict[str, Any] | None:
        entry = self._get("r:" + response_id)
        return None if entry is None else loads(entry.data)

    async def delete_response(self, response_id: str) -> bool:
        return self._get("r:" + response_id) is not None and bool(
            self._entries.pop("r:" + response_id))

    async def claim(self, response_id: str, child_id: str) -> bool:
        entry = self._get("r:" + response_id)
        if entry is None or entry.claimed_by is not None:
            return False
        entry.claimed_by = child_id
        return True

    async def release(self, response_id: str, child_id: str) -> None:
        entry = self._get("r:" + response_id)
        if entry is not None and entry.claimed_by == child_id:
            entry.claimed_by = None

    async def put_conversation(self, conversation_id: str, obj: dict[str, Any],
                               items: list[dict[str, Any]]) -> None:
        encoded = [memoryview(dumps(item)).tobytes() for item in items]
        size = sum(map(len, encoded))
        if size > self.bounds.max_record_bytes:
            raise RecordTooLarge(f"conversation items are {size} bytes, over the limit of "
                                 f"{self.bounds.max_record_bytes} (--max-response-bytes)")
        self._put("c:" + conversation_id, _Entry(self._clock() + self.bounds.ttl_s,
                                                 memoryview(dumps(obj)).tobytes(), encoded,
                                                 size))

    async def get_conversation(self, conversation_id: str) -> dict[str, Any] | None:
        entry = self._get("c:" + conversation_id)
        return None if entry is None else loads(entry.data)

    async def conversation_items(self, conversation_id: str) -> list[dict[str, Any]] | None:
        entry = self._get("c:" + conversation_id)
        return None if entry is None else [loads(item) for item in entry.items or ()]

    async def append_items(self, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        entry = self._get("c:" + conversation_id)
        if entry is None:
            return False
        encoded = [memoryview(dumps(item)).tobytes() for item in items]
        size = entry.size + sum(map(len, encoded))
        if size > self.bounds.max_record_bytes:
            raise RecordTooLarge(f"conversation {conversation_id} would be {size} bytes, over "
                                 f"the limit of {self.bounds.max_record_bytes} "
                                 "(--max-response-bytes)")
        entry.items = [*(entry.items or ()), *encoded]
        entry.size = size
        entry.expires = self._clock() + self.bounds.ttl_s
        self._put("c:" + conversation_id, entry)  # written now: the newest
        return True

    async def delete_item(self, conversation_id: str, item_id: str) -> bool | None:
        entry = self._get("c:" + conversation_id)
        if entry is None:
            return None
        kept = [item for item in entry.items or () if loads(item).get("id") != item_id]
        removed = len(kept) != len(entry.items or ())
        entry.items, entry.size = kept, sum(map(len, kept))
        return removed

    async def delete_conversation(self, conversation_id: str) -> bool:
        return self._get("c:" + conversation_id) is not None and bool(
            self._entries.pop("c:" + conversation_id))

    def live(self) -> int:
        return len(self._entries)
