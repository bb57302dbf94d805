"""The benchmark's HTTP client: keep-alive reuse, a server that drops an idle connection, bodies."""

from __future__ import annotations

import asyncio

import pytest

from benchmark.http import HTTPError, StreamingClient


async def _serve_once_per_connection(reader, writer, served: list[int]) -> None:
    """Answers the first request on a connection (chunked); hangs up on the second without a reply."""
    await reader.readuntil(b"\r\n\r\n")
    body = b"data: hello\n\n"
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                 + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
    await writer.drain()
    served.append(1)
    try:
        await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()


def test_a_dropped_keep_alive_connection_is_retried_once_on_a_new_one():
    async def main() -> tuple[list[str], list[int]]:
        served: list[int] = []
        server = await asyncio.start_server(lambda r, w: _serve_once_per_connection(r, w, served), "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
        lines = []
        async with server, StreamingClient() as client:
            for _ in range(3):
                async with client.post(url, b"{}", {}) as resp:
                    assert resp.status == 200
                    lines += [line async for line in resp.iter_lines() if line]
        return lines, served

    lines, served = asyncio.run(main())
    assert lines == ["data: hello"] * 3 and len(served) == 3


def test_connection_refused_and_bad_urls_are_http_errors():
    async def main() -> None:
        async with StreamingClient() as client:
            with pytest.raises(HTTPError, match="cannot connect to 127.0.0.1:9"):
                async with client.post("http://127.0.0.1:9/x", b"", {}):
                    pass
            with pytest.raises(HTTPError, match="not an http"):
                client.post("ftp://host/x", b"", {})

    asyncio.run(main())
