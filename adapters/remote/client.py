"""The remote backends' one HTTP client: aiohttp's connection pool and parser, nothing above them.

One :class:`HTTPClient` per backend entry: keep-alive connections up to ``max_inflight`` + 1 (unlimited
when unset; the +1 keeps the health check and the load reads from waiting behind generations), the
entry's ``connect``/``read`` timeouts on every socket operation, JSON bodies written by orjson.
:class:`Response` is what the adapters read: ``status_code``, ``headers`` (case-insensitive),
``content``/``text``/``json()`` of a read reply, ``aiter_bytes()`` of a streamed one. Every aiohttp
failure becomes the project's error through the one map (``adapters/remote/http_errors.py``).

A request whose pooled connection fails before any answer came back — the backend had just closed
it (keep-alive expiry, a restart): ``ClientOSError: Can not write request body``, ``Connection reset
by peer``, ``ServerDisconnectedError`` — is sent once more on a fresh connection of its own, as
browsers and Go's ``net/http`` do for idle connections. A refused connection is not retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import orjson

from core.errors import BackendError

from .http_errors import Timeouts, map_transport_error

log = logging.getLogger(__name__)
KEEPALIVE_S = 5.0  # an idle pooled connection's life (httpx's default, which the pool had before)


class Response:
    def __init__(self, response: aiohttp.ClientResponse, to_error: Callable[[BaseException], BackendError],
                 on_close: Callable[[], Awaitable[None]] | None = None):
        self._response, self._to_error, self._on_close = response, to_error, on_close
        self.status_code = response.status
        self.headers: Mapping[str, str] = response.headers
        self._content: bytes | None = None

    @property
    def content(self) -> bytes:
        if self._content is None:
            raise RuntimeError("read the body first (await response.aread())")
        return self._content

    @property
    def text(self) -> str:
        return self.content.decode(self._response.get_encoding(), errors="replace")

    def json(self) -> Any:
        return orjson.loads(self.content)

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


class HTTPClient:
    """One backend's pool: ``base_url``, its timeouts, ``pool_size`` connections (0: no cap)."""

    def __init__(self, base_url: str, timeouts: Timeouts, pool_size: int, where: str):
        self.base_url, self.timeouts, self.pool_size, self.where = base_url.rstrip("/"), timeouts, pool_size, where
        self.timeout = aiohttp.ClientTimeout(sock_connect=timeouts.connect, sock_read=timeouts.read,
                                             connect=timeouts.connect)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def to_error(self, exc: BaseException) -> BackendError:
        return map_transport_error(exc, self.where, self.timeouts)

    def session(self) -> aiohttp.ClientSession:
        """Made on first use on the running loop (again on another loop: a CLI's second ``asyncio.run``)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            connector = aiohttp.TCPConnector(limit=self.pool_size, keepalive_timeout=KEEPALIVE_S)
            self._session, self._loop = aiohttp.ClientSession(connector=connector), loop
        return self._session

    async def stream(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Response:
        """POST ``body`` as JSON; the reply unread, to stream (``aclose`` it)."""
        return await self.send("POST", path, body, headers)

    async def post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Response:
        return await self.read(await self.send("POST", path, body, headers))

    async def get(self, path: str, headers: dict[str, str], timeout: float | None = None) -> Response:
        return await self.read(await self.send("GET", path, None, headers, timeout))

    @staticmethod
    async def read(response: Response) -> Response:
        try:
            await response.aread()
        finally:
            await response.aclose()
        return response

    async def send(self, method: str, path: str, body: dict[str, Any] | None, headers: dict[str, str],
                   timeout: float | None = None) -> Response:
        data = None if body is None else orjson.dumps(body)
        if data is not None:
            headers = {**headers, "Content-Type": "application/json"}
        limit = self.timeout if timeout is None else aiohttp.ClientTimeout(total=timeout)
        try:
            response = await self._send(self.session(), method, path, data, headers, limit)
        except aiohttp.ClientError as exc:
            if not stale_connection(exc):
                raise self.to_error(exc) from exc
            log.info("%s%s: the pooled connection failed before an answer (%s: %s); sending again on a new one",
                     self.base_url, path, type(exc).__name__, exc)
            return await self._retry(method, path, data, headers, limit)
        except TimeoutError as exc:  # a call's own total limit (``timeout``)
            raise self.to_error(exc) from exc
        return Response(response, self.to_error)

    async def _send(self, session: aiohttp.ClientSession, method: str, path: str, data: bytes | None,
                    headers: dict[str, str], timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        return await session.request(method, self.base_url + path, data=data, allow_redirects=False,
                                     timeout=timeout, headers=headers)

    async def _retry(self, method: str, path: str, data: bytes | None, headers: dict[str, str],
                     timeout: aiohttp.ClientTimeout) -> Response:
        """The request once more, on a connection of its own (closed with the response)."""
        fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        try:
            response = await self._send(fresh, method, path, data, headers, timeout)
        except (aiohttp.ClientError, TimeoutError) as exc:
            await fresh.close()
            raise self.to_error(exc) from exc
        except BaseException:
            await fresh.close()
            raise
        return Response(response, self.to_error, on_close=fresh.close)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def stale_connection(exc: aiohttp.ClientError) -> bool:
    """The connection broke before any answer: written into a socket the backend had closed, or closed
    by it while we waited for the status line. Not a refused or timed-out connection."""
    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ServerTimeoutError)):
        return False
    return isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError))
