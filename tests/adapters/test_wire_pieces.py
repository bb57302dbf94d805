"""SSE and NDJSON read off the remote client's streamed reply (one list of lines per socket block): the
same events whatever pieces the bytes arrive in."""

from __future__ import annotations

import asyncio

from adapters.remote.client import HTTPClient
from adapters.remote.http_errors import Timeouts
from adapters.remote.wire import ndjson_objects, sse_data

SSE_PIECES = [b"data: one\r\n\r\n: a comment\n", b"event: x\ndata:two\ndata: lines\n\nda",
              b"ta: cr\r\rdata: {\"k\": 1}\r", b"\n\ndata: last, no blank line"]
NDJSON_PIECES = [b'{"a": 1}\n\n{"b"', b': 2}\r\n  \n{"c": 3}']


async def _read(pieces: list[bytes], read) -> list:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.01)  # separate socket blocks
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    client = HTTPClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", Timeouts(), 0, "test")
    try:
        response = await client.send("GET", "/", None, {})
        try:
            return [item async for item in read(response)]
        finally:
            await response.aclose()
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()


def test_sse_events_whatever_the_pieces():
    assert asyncio.run(_read(SSE_PIECES, sse_data)) == ["one", "two\nlines", "cr", '{"k": 1}', "last, no blank line"]
    assert asyncio.run(_read([b"".join(SSE_PIECES)], sse_data)) == asyncio.run(_read(SSE_PIECES, sse_data))


def test_ndjson_objects_whatever_the_pieces():
    assert asyncio.run(_read(NDJSON_PIECES, ndjson_objects)) == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert asyncio.run(_read([b"".join(NDJSON_PIECES)], ndjson_objects)) == [{"a": 1}, {"b": 2}, {"c": 3}]
