"""A lean HTTP/1.1 streaming POST over asyncio streams, with keep-alive connection reuse.

Why not httpx: the client's own cost sits inside every TTFT and E2EL it measures. On this project's
2-core machine a warm ``httpx.AsyncClient`` took 1.5–2 ms from "about to POST" to the request reaching
a local server, raw asyncio streams 0.1–0.16 ms (tests/benchmark/scripted_server.py logs arrivals);
vLLM's benchmark uses aiohttp for the same reason. This speaks just what the benchmark needs: one
POST with a JSON body, a status line, headers, and a body read as it arrives (chunked, sized or
close-delimited), split into lines.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class HTTPError(Exception):
    """Connection or protocol failure (the message says which)."""


class Response:
    def __init__(self, status: int, reason: str, headers: dict[str, str], reader: asyncio.StreamReader) -> None:
        self.status, self.reason, self.headers, self._reader = status, reason, headers, reader
        self.complete = False

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        reader = self._reader
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await reader.readline()
                    break
                data = await reader.readexactly(size + 2)
                yield data[:-2]
        elif "content-length" in self.headers:
            remaining = int(self.headers["content-length"])
            while remaining > 0:
                data = await reader.read(min(remaining, 65536))
                if not data:
                    raise HTTPError("connection closed before the body ended")
                remaining -= len(data)
                yield data
        else:
            while data := await reader.read(65536):
                yield data
        self.complete = True

    async def iter_lines(self) -> AsyncIterator[str]:
        buffer = b""
        async for data in self.iter_bytes():
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if buffer:
            yield buffer.decode("utf-8", "replace")

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_bytes()])


class StreamingClient:
    """Keeps idle connections per (scheme, host, port); ``post`` is an async context manager."""

    def __init__(self, *, connect_timeout: float = 30.0) -> None:
        self._idle: dict[tuple, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self.connect_timeout = connect_timeout

    def post(self, url: str, body: bytes, headers: dict[str, str]) -> _Exchange:
        return _Exchange(self, url, body, headers)

    async def _connect(self, key: tuple, *, fresh: bool = False) -> tuple[tuple, bool]:
        """(connection, reused): an idle one still open, else a new one."""
        idle = [] if fresh else self._idle.get(key)
        while idle:
            reader, writer = idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return (reader, writer), True
        return await self._open(key), False

    async def _open(self, key: tuple) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        scheme, host, port = key
        context = ssl.create_default_context() if scheme == "https" else None
        try:
            return await asyncio.wait_for(asyncio.open_connection(host, port, ssl=context), self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise HTTPError(f"cannot connect to {host}:{port}: {exc or type(exc).__name__}") from None

    def _release(self, key: tuple, conn: tuple, reusable: bool) -> None:
        if reusable:
            self._idle.setdefault(key, []).append(conn)
        else:
            conn[1].close()

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                writer.close()
        self._idle.clear()

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


class _Exchange:
    def __init__(self, client: StreamingClient, url: str, body: bytes, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HTTPError(f"not an http(s) URL: {url}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self.client, self.key = client, (parts.scheme, parts.hostname, port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"POST {target} HTTP/1.1", f"host: {parts.netloc}", "content-type: application/json",
                 "accept: */*", f"content-length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
        self.raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        self.conn: tuple | None = None
        self.response: Response | None = None

    async def __aenter__(self) -> Response:
        self.conn, reused = await self.client._connect(self.key)
        try:
            self.response = await self._exchange()
        except HTTPError:
            if not reused:
                raise
            # the server closed an idle keep-alive connection as we reused it: once more on a new one
            self.conn, _ = await self.client._connect(self.key, fresh=True)
            self.response = await self._exchange()
        return self.response

    async def _exchange(self) -> Response:
        reader, writer = self.conn
        try:
            writer.write(self.raw)
            await writer.drain()
            status_line = await reader.readline()
            if not status_line:
                raise HTTPError("server closed the connection without a response")
            _, status, *reason = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
            headers = {}
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                key, _, value = line.decode("latin-1").partition(":")
                headers[key.strip().lower()] = value.strip()
            return Response(int(status), reason[0] if reason else "", headers, reader)
        except (OSError, ValueError, asyncio.IncompleteReadError, HTTPError) as exc:
            writer.close()
            raise exc if isinstance(exc, HTTPError) else HTTPError(f"{type(exc).__name__}: {exc}") from None

    async def __aexit__(self, exc_type, exc, tb) -> None:
        response = self.response
        reusable = (exc_type is None and response is not None and response.complete
                    and response.headers.get("connection", "").lower() != "close")
        if self.conn:
            self.client._release(self.key, self.conn, reusable)
