"""The proxy's upstream transport: its legs (`proxy.upstream.legs`) on `proxy.upstream.http1` for `http://`
nodes and on aiohttp's pool for the others (TLS).

`proxy.serving.app.create_app` opens these unless it is handed other legs
(`proxy.upstream.legs.LegsFactory`:
a benchmark stack) or an httpx transport (the tests' network, through `proxy.upstream.httpx_legs`).
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.upstream.aiohttp_legs import AiohttpLegs
from proxy.upstream.http1 import Http1Pool
from proxy.upstream.legs import LegResponse, LegTimeouts


class DefaultLegs:
    """`http://` legs on `proxy.upstream.http1`, any other scheme (TLS) on aiohttp's pool."""

    def __init__(self, timeout: LegTimeouts, headers: Mapping[str, str]) -> None:
        self._http1 = Http1Pool(timeout, headers)
        self._aiohttp = AiohttpLegs(timeout, headers)

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> LegResponse:
        """POST on the pool for url's scheme (`proxy.upstream.legs` errors)."""
        if url.startswith("http://"):
            return await self._http1.post(url, content, headers)
        return await self._aiohttp.post(url, content, headers)

    async def aclose(self) -> None:
        """Close both pools."""
        await self._http1.aclose()
        await self._aiohttp.aclose()
