"""The HTTP face of one emulated node: vLLM's OpenAI server routes on a NodeService.

Routes: POST /v1/chat/completions and /v1/completions (streamed or not), POST /tokenize
(chat messages or a prompt), GET /v1/models, /health, /metrics, /version, and POST
/reset_prefix_cache (a vLLM dev-mode route). Errors are OpenAI-shaped ({"error": {...}}) like
vLLM's.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from quart import Quart, Response, request

from profiler.emulate.openai_format import RequestError, parse
from profiler.emulate.runtime import EngineFailed
from profiler.emulate.service import NodeService
from profiler.engine.frontend import ApiServer

EMULATOR_VERSION = "ppd-emulated"


def _error(exc: RequestError) -> Response:
    return Response(json.dumps(exc.body()), status=exc.status, content_type="application/json")


def create_node_app(service: NodeService) -> Quart:
    """A Quart app serving `service`; its engine loop runs while the app is being served."""
    app = Quart(f"emulated-{service.spec.name}")
    # vLLM's API server is one event loop: a burst of requests reaches the engine in turn
    # (profiler.engine.frontend), on this node's real clock.
    api = ApiServer(service.spec.frontend_service_s, service.spec.frontend_s)

    async def through_api_server(arrived: float, prompt_tokens: int) -> None:
        """Wait out the modelled API server's time on a request that arrived at `arrived`,
        less what it already took here (reading the body, parsing, tokenizing): those are
        part of what the model times, so sleeping the whole of it on top would count them
        twice."""
        reach = api.admit(arrived, prompt_tokens, service.node.engine.stats().running)
        remaining = reach - time.perf_counter()
        if remaining > 0:
            await asyncio.sleep(remaining)
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = 600

    @app.before_serving
    async def start() -> None:
        await service.start()

    @app.after_serving
    async def stop() -> None:
        await service.stop()

    @app.get("/health")
    async def health() -> tuple[str, int]:
        return "", 200

    @app.get("/version")
    async def version() -> dict[str, Any]:
        return {"version": f"{EMULATOR_VERSION} ({service.spec.preset})"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": service.spec.model, "object": "model", "created": 0,
                "owned_by": f"ppd-emulated:{service.spec.preset}", "root": service.spec.model,
                "parent": None, "max_model_len": service.spec.max_model_len, "permission": []}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(),
                        content_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict[str, bool]:
        # vLLM's dev-mode route (VLLM_SERVER_DEV_MODE=1), always on here: 200 with
        # {"success": false} while requests hold blocks, as vLLM answers.
        return {"success": service.node.engine.reset_prefix_cache()}

    @app.post("/tokenize")
    async def tokenize() -> Response:
        arrived = time.perf_counter()
        try:
            try:
                body = json.loads(await request.get_data())
            except ValueError:
                raise RequestError("the request body is not valid JSON") from None
            chat = isinstance(body, dict) and "messages" in body
            ids = service.tokenize(parse(body, chat))
            await through_api_server(arrived, len(ids))  # a pass like any request's
        except RequestError as exc:
            return _error(exc)
        return Response(json.dumps({"count": len(ids), "max_model_len":
                                    service.spec.max_model_len, "tokens": ids}),
                        content_type="application/json")

    @app.post("/v1/chat/completions")
    async def chat() -> Response:
        return await _complete(chat=True)

    @app.post("/v1/completions")
    async def completions() -> Response:
        return await _complete(chat=False)

    async def _complete(chat: bool) -> Response:
        arrived = time.perf_counter()
        raw = await request.get_data()
        try:
            try:
                body = json.loads(raw)
            except ValueError:
                raise RequestError("the request body is not valid JSON") from None
            parsed = parse(body, chat)
            request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
            prepared = service.prepare(parsed, request_id)
            await through_api_server(arrived, len(prepared.job.prompt_ids))
            await service.read_back(prepared)  # a readback P leg: D's KV first
            running = service.start_job(prepared)
        except RequestError as exc:
            return _error(exc)
        if parsed.stream:
            return Response(running.sse(), content_type="text/event-stream",
                            headers={"Cache-Control": "no-cache"})
        try:
            answer = await running.answer()
        except EngineFailed as exc:
            return _error(RequestError(str(exc), 500, kind="InternalServerError"))
        return Response(json.dumps(answer), content_type="application/json")

    return app
