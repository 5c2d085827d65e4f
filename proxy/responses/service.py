"""One `POST /v1/responses` turn, start to finish: chain -> session -> router -> stored response.

The turn's history is read from the store - the previous response's items (its chain: every
earlier turn's input and output), or the conversation's - and sent whole as one chat request
(`proxy.responses.chain`). Its session is named by identity, not by transcript: a turn that
names a previous response continues that response's session, a turn in a conversation the
conversation's, a new turn starts one named by its own id. The router
(`proxy.routing.router.Router.handle`) then routes it like any other turn of that session: turn 2+
by the policy (local on the D that holds it, P->D, readback), with the session's fingerprint
check as for chat. Only the first turn that names a response continues its session (the
store's claim); a second one is a fork, a session of its own (turn 1, P->D), so two branches
never share one D's history. A turn that fails gives its claim back.

The response is stored (when `store` is not false) before the client can learn its id: the
JSON answer is sent after the write, a stream's `response.completed` event after it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from proxy.responses.chain import chat_body
from proxy.responses.events import EventWriter
from proxy.responses.items import ResponseRequest, new_id
from proxy.responses.objects import Output, response_object
from proxy.responses.store import RecordTooLarge, ResponseStore, encode
from proxy.routing.router import Incoming, Reply, Router
from proxy.shared.errors import NotFound, ProxyError
from proxy.shared.json_codec import dumps, loads
from proxy.shared.validate import Endpoint, validate_body
from proxy.upstream.relay import Relay

log = logging.getLogger("ppd.proxy")


class ResponseNotFound(NotFound):
    """An unknown, deleted, expired or never stored response or conversation."""

    type = "invalid_request_error"
    code = "not_found"


class NodeRejected(ProxyError):
    """A node refused the turn (4xx): its status and message, as the client's fault."""

    type = "invalid_request_error"
    code = "upstream_rejected"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status  # type: ignore[misc]  # the node's own 4xx


@dataclass(slots=True)
class Created:
    """What a create answers: the response as JSON, or its event stream; the route headers."""

    headers: dict[str, str]
    body: bytes | None = None
    events: AsyncIterator[bytes] | None = None


@dataclass(slots=True)
class _Turn:
    request: ResponseRequest
    response_id: str
    created_at: int
    history: list[dict[str, Any]]
    session: str
    claimed: str | None  # the previous response this turn holds the claim on


class ResponsesService:
    """Serves response turns through the router and keeps what they leave in the store."""

    def __init__(self, router: Router, store: ResponseStore, max_messages: int) -> None:
        self.router = router
        self.store = store
        self.max_messages = max_messages

    async def create(self, body: dict[str, Any]) -> Created:
        """One turn (ProxyError before anything is sent: bad request, unknown id, ...)."""
        request = ResponseRequest.parse(body)
        turn = await self._turn(request)
        chat = chat_body(request, turn.history)
        try:
            validate_body(Endpoint.CHAT, chat, self.max_messages)
            if request.store or request.conversation is not None:
                # Refused before it runs, not after: the chain is over the bound already.
                encode({"items": [*turn.history, *request.input]}, self.store.bounds,
                       "the response's history")
            reply = await self.router.handle(Incoming(Endpoint.CHAT, chat, turn.session))
            if reply.status >= 400:
                raise _rejected(reply)
        except BaseException:
            await self._release(turn)
            raise
        if isinstance(reply.body, Relay):
            return Created(reply.headers, events=self._events(turn, reply.body))
        output = Output.from_chat(loads(reply.body))
        status, incomplete = output.status()
        response = response_object(turn.response_id, request, status, output.items(),
                                   created_at=turn.created_at, usage=output.response_usage(),
                                   incomplete=incomplete)
        response = await self._keep(turn, response)
        return Created(reply.headers, body=dumps(response))

    async def _turn(self, request: ResponseRequest) -> _Turn:
        response_id = new_id("resp")
        created_at = int(time.time())
        if request.previous_response_id is not None:
            previous = await self.store.get_response(request.previous_response_id)
            if previous is None:
                raise ResponseNotFound(f"Previous response with id "
                                       f"'{request.previous_response_id}' not found.",
                                       param="previous_response_id")
            if await self.store.claim(request.previous_response_id, response_id):
                return _Turn(request, response_id, created_at, previous["items"],
                             previous["session"], request.previous_response_id)
            # A fork: the previous response's session already went on without this branch.
            return _Turn(request, response_id, created_at, previous["items"], response_id, None)
        if request.conversation is not None:
            items = await self.store.conversation_items(request.conversation)
            if items is None:
                raise ResponseNotFound(f"Conversation with id '{request.conversation}' not "
                                       "found.", param="conversation")
            return _Turn(request, response_id, created_at, items, request.conversation, None)
        return _Turn(request, response_id, created_at, [], response_id, None)

    async def _release(self, turn: _Turn) -> None:
        if turn.claimed is not None:
            await self.store.release(turn.claimed, turn.response_id)

    async def _keep(self, turn: _Turn, response: dict[str, Any]) -> dict[str, Any]:
        """Store the response and add the turn to its conversation; the response as stored
        (`store: false` when it was over the size bound and is not kept)."""
        request = turn.request
        output = response["output"]
        if request.conversation is not None:
            try:
                await self.store.append_items(request.conversation, [*request.input, *output])
            except RecordTooLarge as exc:  # the answer took it over: the client still gets it
                log.warning("conversation %s not extended by response %s: %s",
                            request.conversation, turn.response_id, exc.message)
        if not request.store:
            return response
        # The chain's items hold this turn's input and output: the response keeps neither
        # twice (a record is read back by `_unpack`).
        record = {"response": {**response, "output": None}, "session": turn.session,
                  "input_at": len(turn.history), "output_at": len(turn.history) +
                  len(request.input), "items": [*turn.history, *request.input, *output]}
        try:
            await self.store.put_response(turn.response_id, record)
        except RecordTooLarge as exc:
            # The answer is the client's either way; its id cannot be continued, and says so.
            log.warning("response %s not stored: %s", turn.response_id, exc.message)
            return {**response, "store": False}
        return response

    async def _events(self, turn: _Turn, relay: Relay) -> AsyncIterator[bytes]:
        """The turn's events from the relayed chat stream; the response stored before its
        `response.completed`."""
        writer = EventWriter(turn.response_id, turn.request, turn.created_at)
        finished = False
        relay.record_late = False  # Quart's writes yield: the turn is recorded before [DONE]
        try:
            yield writer.opening()
            buffer = b""
            done = False
            async for chunk in relay:
                buffer += chunk
                while (end := buffer.find(b"\n\n")) >= 0:
                    event, buffer = buffer[:end], buffer[end + 2:]
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            done = True
                            continue
                        payload = loads(data)
                        if isinstance(payload, dict) and "error" in payload:
                            error = payload["error"]
                            message = error.get("message") if isinstance(error, dict) else error
                            yield writer.failed(str(message))
                            return
                        if isinstance(payload, dict) and (events := writer.feed(payload)):
                            yield events
            if not done:
                yield writer.failed("the upstream stream ended before it finished")
                return
            tail, response = writer.closing()
            yield tail
            response = await self._keep(turn, response)
            finished = True
            yield writer.final(response)
        finally:
            await relay.aclose()
            if not finished:
                await self._release(turn)

    async def retrieve(self, response_id: str) -> dict[str, Any]:
        """A stored response (404 when unknown, deleted, expired or never stored)."""
        record = await self._record(response_id)
        return {**record["response"], "output": record["items"][record["output_at"]:]}

    async def input_items(self, response_id: str) -> list[dict[str, Any]]:
        """The input items a stored response's turn was given."""
        record = await self._record(response_id)
        return list(record["items"][record["input_at"]:record["output_at"]])

    async def delete(self, response_id: str) -> dict[str, Any]:
        """Forget a response (404 when it is not there)."""
        if not await self.store.delete_response(response_id):
            raise _not_found("Response", response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def _record(self, response_id: str) -> dict[str, Any]:
        record = await self.store.get_response(response_id)
        if record is None:
            raise _not_found("Response", response_id)
        return record


def _not_found(kind: str, object_id: str) -> ResponseNotFound:
    return ResponseNotFound(f"{kind} with id '{object_id}' not found.")


def _rejected(reply: Reply) -> NodeRejected:
    message = f"a node refused the request with status {reply.status}"
    if isinstance(reply.body, bytes):
        try:
            error = loads(reply.body).get("error")
            message = str(error.get("message") if isinstance(error, dict) else error or message)
        except (ValueError, AttributeError):
            pass
    return NodeRejected(reply.status, message)
