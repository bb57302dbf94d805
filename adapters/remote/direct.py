"""The remote backends' two hot calls straight on aiohttp, under the httpx client they are built with.

``RemoteBackend`` talks httpx (tests inject ``httpx.MockTransport`` clients), and its default client
runs on aiohttp's connection pool (``httpx-aiohttp``). For ``post_stream``/``post_json`` on that
default client, :class:`Direct` sends the request on the same aiohttp session without httpx's
request/response layer (URL parsing, header objects, auth and redirect wrappers, text decoders),
about a tenth of the gateway's CPU per request. :class:`DirectResponse` offers the part of
``httpx.Response`` the adapters read (``status_code``, ``headers``, ``aiter_bytes``, ``aread``,
``content``); aiohttp failures become the project's errors through the same mapping
(``adapters/remote/http_errors.py``), so an adapter cannot tell the two paths apart.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
from httpx_aiohttp import AiohttpTransport

from adapters.core.errors import BackendError


class DirectResponse:
    def __init__(self, response: aiohttp.ClientResponse, to_error: Callable[[BaseException], BackendError]):
        self._response, self._to_error = response, to_error
        self.status_code = response.status
        self.headers = response.headers
        self._content: bytes | None = None

    @property
    def content(self) -> bytes:
        if self._content is None:
            raise RuntimeError("read the body first (await response.aread())")
        return self._content

    async def aread(self) -> bytes:
        if self._content is None:
            try:
                self._content = await self._response.read()
            except aiohttp.ClientError as exc:
                raise self._to_error(exc) from exc
        return self._content

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body as it arrives, one block per socket read (``adapters/remote/wire.py`` splits the lines)."""
        try:
            async for data in self._response.content.iter_any():
                yield data
        except aiohttp.ClientError as exc:
            raise self._to_error(exc) from exc

    async def aclose(self) -> None:
        """Back to the pool when read to the end, else the connection closes (the backend sees it)."""
        self._response.release()
        await self._response.wait_for_close()


class Direct:
    """The aiohttp session of an ``AiohttpTransport`` and a backend's URL and timeouts."""

    def __init__(self, transport: AiohttpTransport, base_url: str, connect: float, read: float):
        self.transport, self.base_url = transport, base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(sock_connect=connect, sock_read=read, connect=connect)

    def session(self) -> aiohttp.ClientSession:
        if not isinstance(self.transport.client, aiohttp.ClientSession):
            self.transport.client = self.transport.get_client()
        return self.transport.client

    async def post(self, path: str, body: dict[str, Any], headers: dict[str, str],
                   to_error: Callable[[BaseException], BackendError]) -> DirectResponse:
        try:
            response = await self.session().post(
                self.base_url + path, data=orjson.dumps(body), allow_redirects=False, timeout=self.timeout,
                headers={**headers, "Content-Type": "application/json"})
        except aiohttp.ClientError as exc:
            raise to_error(exc) from exc
        return DirectResponse(response, to_error)
