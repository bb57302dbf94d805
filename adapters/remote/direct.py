"""The remote backends' two hot calls straight on aiohttp, under the httpx client they are built with.

``RemoteBackend`` talks httpx (tests inject ``httpx.MockTransport`` clients), and its default client
runs on aiohttp's connection pool (``httpx-aiohttp``). For ``post_stream``/``post_json`` on that
default client, :class:`Direct` sends the request on the same aiohttp session without httpx's
request/response layer (URL parsing, header objects, auth and redirect wrappers, text decoders),
about a tenth of the gateway's CPU per request. :class:`DirectResponse` offers the part of
``httpx.Response`` the adapters read (``status_code``, ``headers``, ``aiter_bytes``, ``aread``,
``content``); aiohttp failures become the project's errors through the same mapping
(``adapters/remote/http_errors.py``), so an adapter cannot tell the two paths apart.

A request whose pooled connection fails before any answer came back — the backend had just closed
it (keep-alive expiry, a restart): ``ClientOSError: Can not write request body``, ``Connection reset
by peer``, ``ServerDisconnectedError`` — is sent once more on a fresh connection of its own, as
browsers and Go's ``net/http`` do for idle connections. A refused connection is not retried.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from httpx_aiohttp import AiohttpTransport

from core.errors import BackendError

log = logging.getLogger(__name__)


class DirectResponse:
    def __init__(self, response: aiohttp.ClientResponse, to_error: Callable[[BaseException], BackendError],
                 on_close: Callable[[], Awaitable[None]] | None = None):
        self._response, self._to_error, self._on_close = response, to_error, on_close
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
        if self._on_close is not None:
            await self._on_close()


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
        data, headers = orjson.dumps(body), {**headers, "Content-Type": "application/json"}
        try:
            response = await self._send(self.session(), path, data, headers)
        except aiohttp.ClientError as exc:
            if not stale_connection(exc):
                raise to_error(exc) from exc
            log.info("%s%s: the pooled connection failed before an answer (%s: %s); sending again on a new one",
                     self.base_url, path, type(exc).__name__, exc)
            return await self._retry(path, data, headers, to_error)
        return DirectResponse(response, to_error)

    async def _send(self, session: aiohttp.ClientSession, path: str, data: bytes,
                    headers: dict[str, str]) -> aiohttp.ClientResponse:
        return await session.post(self.base_url + path, data=data, allow_redirects=False, timeout=self.timeout,
                                  headers=headers)

    async def _retry(self, path: str, data: bytes, headers: dict[str, str],
                     to_error: Callable[[BaseException], BackendError]) -> DirectResponse:
        """The request once more, on a connection of its own (closed with the response)."""
        fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        try:
            response = await self._send(fresh, path, data, headers)
        except aiohttp.ClientError as exc:
            await fresh.close()
            raise to_error(exc) from exc
        except BaseException:
            await fresh.close()
            raise
        return DirectResponse(response, to_error, on_close=fresh.close)


def stale_connection(exc: aiohttp.ClientError) -> bool:
    """The connection broke before any answer: written into a socket the backend had closed, or closed
    by it while we waited for the status line. Not a refused or timed-out connection."""
    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ServerTimeoutError)):
        return False
    return isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError))
