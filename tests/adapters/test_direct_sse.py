"""SSE and NDJSON read off a direct aiohttp reply (one list of lines per socket block) give exactly
what the httpx path gives, line by line, for the same bytes sent in awkward pieces."""

from __future__ import annotations

import asyncio

import aiohttp
import httpx

from adapters.remote.direct import DirectResponse
from adapters.remote.wire import ndjson_objects, sse_data

SSE_PIECES = [b"data: one\r\n\r\n: a comment\n", b"event: x\ndata:two\ndata: lines\n\nda",
              b"ta: cr\r\rdata: {\"k\": 1}\r", b"\n\ndata: last, no blank line"]
NDJSON_PIECES = [b'{"a": 1}\n\n{"b"', b': 2}\r\n  \n{"c": 3}']


async def _direct(pieces: list[bytes], read) -> list:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.01)  # separate socket blocks
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/") as response:
                return [item async for item in read(DirectResponse(response, lambda exc: exc))]
    finally:
        server.close()
        await server.wait_closed()


async def _httpx(pieces: list[bytes], read) -> list:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=b"".join(pieces)))
    async with httpx.AsyncClient(transport=transport) as client:
        async with client.stream("GET", "http://test/") as response:
            return [item async for item in read(response)]


def test_sse_direct_equals_httpx():
    direct = asyncio.run(_direct(SSE_PIECES, sse_data))
    assert direct == asyncio.run(_httpx(SSE_PIECES, sse_data))
    assert direct == ["one", "two\nlines", "cr", '{"k": 1}', "last, no blank line"]


def test_ndjson_direct_equals_httpx():
    direct = asyncio.run(_direct(NDJSON_PIECES, ndjson_objects))
    assert direct == asyncio.run(_httpx(NDJSON_PIECES, ndjson_objects))
    assert direct == [{"a": 1}, {"b": 2}, {"c": 3}]
