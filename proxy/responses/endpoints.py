"""The Responses and Conversations routes, on the proxy's Quart app: thin handlers.

Each reads and checks the request (API key, strict JSON; the app's `--max-body-bytes` gives
413), calls `ResponsesService` or `Conversations`, and answers JSON or the event stream.
Errors are the proxy's (`proxy.shared.errors`), answered in OpenAI's shape by the app's handlers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quart import Blueprint, Response, request

from proxy.responses.conversations import Conversations, list_page
from proxy.responses.service import ResponsesService
from proxy.shared.errors import BadRequest, Unauthorized
from proxy.shared.json_codec import dumps
from proxy.shared.validate import bearer_matches, parse_json_object


def responses_blueprint(service: ResponsesService, conversations: Conversations,
                        api_keys: Callable[[], tuple[str | None, ...]]) -> Blueprint:
    """The routes; `api_keys` the keys a request may carry (none set: open)."""
    routes = Blueprint("responses", __name__)

    @routes.before_request
    async def authorize() -> None:
        keys = api_keys()
        if keys[0] and not bearer_matches(request.headers.get("authorization"), *keys):
            raise Unauthorized("missing or invalid API key (authorization: Bearer KEY)")

    @routes.post("/v1/responses")
    async def create() -> Response:
        created = await service.create(await _body())
        if created.events is not None:
            return Response(created.events, headers=created.headers,
                            content_type="text/event-stream")
        return Response(created.body, headers=created.headers, content_type="application/json")

    @routes.get("/v1/responses/<response_id>")
    async def retrieve(response_id: str) -> Response:
        return _json(await service.retrieve(response_id))

    @routes.delete("/v1/responses/<response_id>")
    async def delete(response_id: str) -> Response:
        return _json(await service.delete(response_id))

    @routes.get("/v1/responses/<response_id>/input_items")
    async def input_items(response_id: str) -> Response:
        return _json(list_page(await service.input_items(response_id), _query()))

    @routes.post("/v1/conversations")
    async def create_conversation() -> Response:
        return _json(await conversations.create(await _body()))

    @routes.get("/v1/conversations/<conversation_id>")
    async def get_conversation(conversation_id: str) -> Response:
        return _json(await conversations.get(conversation_id))

    @routes.delete("/v1/conversations/<conversation_id>")
    async def delete_conversation(conversation_id: str) -> Response:
        return _json(await conversations.delete(conversation_id))

    @routes.post("/v1/conversations/<conversation_id>/items")
    async def add_items(conversation_id: str) -> Response:
        return _json(await conversations.add_items(conversation_id, await _body()))

    @routes.get("/v1/conversations/<conversation_id>/items")
    async def list_items(conversation_id: str) -> Response:
        return _json(await conversations.items(conversation_id, _query()))

    @routes.get("/v1/conversations/<conversation_id>/items/<item_id>")
    async def get_item(conversation_id: str, item_id: str) -> Response:
        return _json(await conversations.item(conversation_id, item_id))

    @routes.delete("/v1/conversations/<conversation_id>/items/<item_id>")
    async def delete_item(conversation_id: str, item_id: str) -> Response:
        return _json(await conversations.delete_item(conversation_id, item_id))

    return routes


async def _body() -> dict[str, Any]:
    raw = await request.get_data()
    if not raw:
        raise BadRequest("the request needs a JSON object body")
    return parse_json_object(raw if isinstance(raw, bytes) else raw.encode())


def _query() -> dict[str, str]:
    return {key: request.args[key] for key in ("limit", "order", "after") if key in request.args}


def _json(value: dict[str, Any]) -> Response:
    return Response(dumps(value), content_type="application/json")
