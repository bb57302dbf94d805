"""A minimal, fast OpenAI-compatible server for measuring what a gateway adds: no model, canned answers.

    python bench/fast_openai_server.py --port 8001 [--chunks 16]

Serves, on 127.0.0.1, HTTP/1.1 with keep-alive (raw asyncio protocol, uvloop when installed, no framework):

- ``GET /v1/models``: one model, ``fast``;
- ``POST /v1/chat/completions``: echoes the request's ``model``; ``max_tokens`` (default ``--chunks``)
  content chunks of ``" tok"``; ``usage`` = words in the messages as prompt tokens, the chunk count as
  completion tokens. With ``"stream": true`` an SSE stream (chunked transfer encoding): a role chunk,
  the content chunks (the last with ``finish_reason: "length"``), a usage chunk with empty ``choices``
  when ``stream_options.include_usage`` is set, then ``data: [DONE]``; all written at once.

Responses are built once per (model, chunks, stream, usage, prompt tokens) and cached, so a request
costs a header parse, a ``json.loads`` and one ``write``: far less than any gateway in front of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from functools import lru_cache

CREATED = int(time.time())
MODELS = json.dumps({"object": "list", "data": [{"id": "fast", "object": "model", "created": CREATED,
                                                 "owned_by": "bench"}]}).encode()


def _head(status: str, content_type: str, length: int | None) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{framing}\r\n"
            "Connection: keep-alive\r\n\r\n").encode()


def _json_response(body: bytes, status: str = "200 OK") -> bytes:
    return _head(status, "application/json", len(body)) + body


def _usage(prompt_tokens: int, chunks: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": chunks, "total_tokens": prompt_tokens + chunks}


@lru_cache(maxsize=256)
def chat_response(model: str, chunks: int, stream: bool, include_usage: bool, prompt_tokens: int) -> bytes:
    """The whole HTTP response (status line to last byte) for one kind of request."""
    if not stream:
        body = {"id": "chatcmpl-fast", "object": "chat.completion", "created": CREATED, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": " tok" * chunks},
                             "logprobs": None, "finish_reason": "length"}],
                "usage": _usage(prompt_tokens, chunks)}
        return _json_response(json.dumps(body).encode())
    head = {"id": "chatcmpl-fast", "object": "chat.completion.chunk", "created": CREATED, "model": model}

    def event(choices: list, **extra) -> bytes:
        data = f"data: {json.dumps({**head, 'choices': choices, **extra})}\n\n".encode()
        return b"%x\r\n%s\r\n" % (len(data), data)

    def delta(content: dict, finish: str | None) -> list:
        return [{"index": 0, "delta": content, "logprobs": None, "finish_reason": finish}]

    parts = [event(delta({"role": "assistant", "content": ""}, None))]
    parts += [event(delta({"content": " tok"}, "length" if i == chunks - 1 else None)) for i in range(chunks)]
    if include_usage:
        parts.append(event([], usage=_usage(prompt_tokens, chunks)))
    done = b"data: [DONE]\n\n"
    parts.append(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
    return _head("200 OK", "text/event-stream", None) + b"".join(parts)


def _words(messages: object) -> int:
    if not isinstance(messages, list):
        return 0
    return sum(len(m["content"].split()) for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str))


def answer(method: str, path: str, body: bytes, default_chunks: int) -> bytes:
    path = path.split("?", 1)[0]
    if method == "GET" and path in ("/v1/models", "/models"):
        return _json_response(MODELS)
    if method == "GET" and path in ("/", "/health"):
        return _json_response(b'{"status":"ok"}')
    if method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
        try:
            req = json.loads(body)
            chunks = int(req.get("max_tokens") or req.get("max_completion_tokens") or default_chunks)
            stream = bool(req.get("stream"))
            include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
            return chat_response(str(req.get("model", "fast")), max(chunks, 1), stream, include_usage,
                                 _words(req.get("messages")))
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            err = json.dumps({"error": {"message": f"bad request: {exc}", "type": "invalid_request_error"}})
            return _json_response(err.encode(), "400 Bad Request")
    return _json_response(b'{"error":{"message":"not found","type":"not_found"}}', "404 Not Found")


class HTTPProtocol(asyncio.Protocol):
    """HTTP/1.1 requests with Content-Length or chunked bodies; pipelined requests answered in order."""

    def __init__(self, default_chunks: int):
        self.default_chunks = default_chunks
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None and not self.transport.is_closing():
            request = self._next_request()
            if request is None:
                return
            method, path, body, close = request
            self.transport.write(answer(method, path, body, self.default_chunks))
            if close:
                self.transport.close()

    def _next_request(self) -> tuple[str, str, bytes, bool] | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        lines = self.buffer[:end].decode("latin-1").split("\r\n")
        method, path, version = (lines[0].split(" ") + ["", "", ""])[:3]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        start = end + 4
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parsed = _dechunk(self.buffer, start)
            if parsed is None:
                return None
            body, start = parsed
        else:
            length = int(headers.get("content-length") or 0)
            if len(self.buffer) < start + length:
                return None
            body, start = self.buffer[start:start + length], start + length
        self.buffer = self.buffer[start:]
        close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
        return method, path, body, close


def _dechunk(buffer: bytes, pos: int) -> tuple[bytes, int] | None:
    """A complete chunked body starting at ``pos``: (body, end position), or None when more bytes are needed."""
    out = []
    while True:
        eol = buffer.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(buffer[pos:eol].split(b";")[0], 16)
        if size == 0:
            trailer_end = buffer.find(b"\r\n\r\n", eol)
            if buffer[eol:eol + 4] == b"\r\n\r\n":
                return b"".join(out), eol + 4
            return (b"".join(out), trailer_end + 4) if trailer_end >= 0 else None
        if len(buffer) < eol + 2 + size + 2:
            return None
        out.append(buffer[eol + 2:eol + 2 + size])
        pos = eol + 2 + size + 2


async def serve(port: int, default_chunks: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: HTTPProtocol(default_chunks), "127.0.0.1", port, backlog=2048)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=16, help="content chunks when a request has no max_tokens")
    args = parser.parse_args()
    try:
        import uvloop
        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve(args.port, args.chunks))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
