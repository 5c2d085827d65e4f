"""The floor: a proxy made of ppd's parts with none of its logic (the `floor` stack).

What any Python proxy built from uvicorn (uvloop + httptools) and an aiohttp client pays for
its network hops alone, so ppd's rows can be read as floor + ppd's own work. No validation,
sessions, counting, policy, failover, metrics or logs: `--policy local` relays every request
to D (one hop more than `direct`), `--policy pd` asks P first (`max_tokens: 1` and the
`kv_transfer_params` marker, as ppd does), then relays D's stream (two hops more). The body
is patched as bytes, not parsed, so not even JSON is paid for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import aiohttp

from proxy.policies import pd as pd_policy

Message = MutableMapping[str, Any]
_P_PATCH = b'{"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true},'


class FloorApp:
    """ASGI: /health answers 200; a completion POST is relayed; nothing else is checked."""

    def __init__(self, prefill: str, decode: str, policy: str) -> None:
        self._prefill, self._decode, self._pd = prefill, decode, policy == pd_policy.NAME
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Message, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        headers = {"content-type": "application/json"}
        if self._pd:
            async with self._session.post(self._prefill + scope["path"], headers=headers,
                                          data=_P_PATCH + body[1:]) as answer:
                await answer.read()
        async with self._session.post(self._decode + scope["path"], headers=headers,
                                      data=body) as upstream:
            await send({"type": "http.response.start", "status": upstream.status,
                        "headers": [(b"content-type", b"text/event-stream")]})
            async for chunk in upstream.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

