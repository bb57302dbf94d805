"""The benchmark's HTTP client (aiohttp): keep-alive reuse, a server that drops a kept-alive connection,
lines longer than aiohttp's line reader takes, a server that is down."""

from __future__ import annotations

import asyncio
import json

import pytest

from benchmark.clients import Endpoint, open_session, send_request
from benchmark.records import BenchRequest

REQUEST = BenchRequest("hi", 1, 4)


def _sse(*events: dict) -> bytes:
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


async def _serve_once_per_connection(reader, writer, served: list[int], reply: bytes) -> None:
    """Answers the first request on a connection; hangs up on the second without a reply."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)
    writer.write(reply)
    await writer.drain()
    served.append(1)
    try:
        await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()


def _run(reply: bytes, requests: int):
    async def main():
        served: list[int] = []
        server = await asyncio.start_server(lambda r, w: _serve_once_per_connection(r, w, served, reply),
                                            "127.0.0.1", 0)
        endpoint = Endpoint(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", "m", "openai-completions")
        async with server, open_session() as session:
            records = [await send_request(session, endpoint, REQUEST, f"r{i}") for i in range(requests)]
        return records, served

    return asyncio.run(main())


def test_a_dropped_keep_alive_connection_is_sent_once_more_on_a_new_one():
    reply = _sse({"choices": [{"index": 0, "text": "hello"}]},
                 {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    records, served = _run(reply, 3)
    assert [(r.success, r.error, r.generated_text, r.output_tokens) for r in records] == [(True, "", "hello", 1)] * 3
    assert len(served) == 3


def test_lines_longer_than_aiohttps_line_limit_are_read_whole():
    text = "x" * 300_000  # aiohttp's readline refuses lines over 128 KiB
    records, _ = _run(_sse({"choices": [{"index": 0, "text": text}]}), 1)
    assert records[0].success, records[0].error
    assert records[0].generated_text == text


def test_a_server_that_is_down_is_a_failed_record_saying_so():
    async def main():
        async with open_session() as session:
            return await send_request(session, Endpoint("http://127.0.0.1:9", "m"), REQUEST, "r0")

    record = asyncio.run(main())
    assert not record.success
    assert record.error.startswith("ClientConnectorError: Cannot connect to host 127.0.0.1:9")


def _chat_run(reply: bytes):
    async def main():
        server = await asyncio.start_server(lambda r, w: _serve_once_per_connection(r, w, [], reply), "127.0.0.1", 0)
        endpoint = Endpoint(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", "m", "openai-chat")
        async with server, open_session() as session:
            return await send_request(session, endpoint, REQUEST, "r0")

    return asyncio.run(main())


def test_every_event_with_choices_is_a_token_chunk_as_in_vllms_benchmark():
    """vLLM's stream: a role chunk, one chunk per step, "" while its detokenizer holds a token back, the
    last token with the finish reason, a usage chunk with no choices: 5 token chunks, 4 gaps."""
    reply = _sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                 {"choices": [{"index": 0, "delta": {"content": "Par"}}]},
                 {"choices": [{"index": 0, "delta": {"content": ""}}]},
                 {"choices": [{"index": 0, "delta": {"reasoning": "hmm"}}]},
                 {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "length"}]},
                 {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 4}})
    record = _chat_run(reply)
    assert record.success, record.error
    assert (len(record.itl), record.generated_text, record.output_tokens) == (4, "Par", 4)
    assert record.latency == pytest.approx(record.ttft + sum(record.itl))
