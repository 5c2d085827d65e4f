"""Conversations (`/v1/conversations`): an object, its items, and the lists OpenAI pages.

A conversation holds items - what its turns were given and answered, or what a client added
- in order; a response created with `conversation` reads them all as its history and adds
its input and output at the end (`proxy.responses.service`).
"""

from __future__ import annotations

import time
from typing import Any

from proxy.responses.items import new_id, normalize_input
from proxy.responses.service import ResponseNotFound
from proxy.responses.store import ResponseStore
from proxy.shared.errors import BadRequest

MAX_LIST_LIMIT = 100


class Conversations:
    """The conversation endpoints' work over the store."""

    def __init__(self, store: ResponseStore) -> None:
        self.store = store

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """A new conversation, with the body's `items` (optional) and `metadata`."""
        items = normalize_input(body["items"], "items") if body.get("items") else []
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise BadRequest("'metadata' must be an object", param="metadata")
        conversation_id = new_id("conv")
        conversation = {"id": conversation_id, "object": "conversation",
                        "created_at": int(time.time()), "metadata": metadata}
        await self.store.put_conversation(conversation_id, conversation, items)
        return conversation

    async def get(self, conversation_id: str) -> dict[str, Any]:
        """A conversation's object (404 when it is gone)."""
        conversation = await self.store.get_conversation(conversation_id)
        if conversation is None:
            raise _not_found(conversation_id)
        return conversation

    async def delete(self, conversation_id: str) -> dict[str, Any]:
        """Forget a conversation and its items."""
        if not await self.store.delete_conversation(conversation_id):
            raise _not_found(conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    async def add_items(self, conversation_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Append the body's `items`; the list of what was added."""
        items = normalize_input(body.get("items"), "items")
        if not await self.store.append_items(conversation_id, items):
            raise _not_found(conversation_id)
        return page(items, len(items), False)

    async def items(self, conversation_id: str, query: dict[str, str]) -> dict[str, Any]:
        """A page of a conversation's items (`limit`, `order`, `after`)."""
        items = await self.store.conversation_items(conversation_id)
        if items is None:
            raise _not_found(conversation_id)
        return list_page(items, query)

    async def item(self, conversation_id: str, item_id: str) -> dict[str, Any]:
        """One item of a conversation."""
        items = await self.store.conversation_items(conversation_id)
        if items is None:
            raise _not_found(conversation_id)
        for item in items:
            if item.get("id") == item_id:
                return item
        raise ResponseNotFound(f"Item with id '{item_id}' not found.")

    async def delete_item(self, conversation_id: str, item_id: str) -> dict[str, Any]:
        """Remove one item; the conversation (as OpenAI answers)."""
        removed = await self.store.delete_item(conversation_id, item_id)
        if removed is None:
            raise _not_found(conversation_id)
        if not removed:
            raise ResponseNotFound(f"Item with id '{item_id}' not found.")
        return await self.get(conversation_id)


def _not_found(conversation_id: str) -> ResponseNotFound:
    return ResponseNotFound(f"Conversation with id '{conversation_id}' not found.")


def list_page(items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    """OpenAI's cursor page: `order` asc|desc (default desc), `after` an item id, `limit`
    1-100 (default 20)."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest("'order' must be asc or desc", param="order")
    raw_limit = query.get("limit", "20")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST_LIMIT:
        raise BadRequest(f"'limit' must be an integer in [1, {MAX_LIST_LIMIT}]", param="limit")
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise BadRequest(f"'after' names no item here: {after!r}", param="after")
        ordered = ordered[ids.index(after) + 1:]
    limit = int(raw_limit)
    return page(ordered[:limit], limit, len(ordered) > limit)


def page(data: list[dict[str, Any]], limit: int, has_more: bool) -> dict[str, Any]:
    """A list object."""
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}
