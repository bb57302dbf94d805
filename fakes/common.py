"""Plumbing shared by the fake servers: exact-bytes replies, disconnect counting, request logging
and the token-by-token stream driver that applies the :class:`Behaviour` faults."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.requests import Request

from .behaviour import Behaviour

Body = bytes | AsyncIterator[bytes]


def dumps(value: Any) -> str:
    """Compact JSON, as pydantic, serde and rapidjson all write it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class DropConnection(Exception):
    """Raised by a stream body to cut the connection without finishing the response."""


class Reply:
    """An ASGI response with exact status, headers and bytes.

    Waits ``first_byte_delay`` before the status line, streams an async-iterator body chunk by chunk,
    counts ``behaviour.disconnects`` when the client leaves before the last byte (watching ASGI
    ``http.disconnect``), and on :class:`DropConnection` returns without finishing, so uvicorn
    closes the socket mid-body.
    """

    def __init__(self, behaviour: Behaviour, status: int, headers: dict[str, str], body: Body):
        self.behaviour, self.status, self.body = behaviour, status, body
        self.headers = dict(headers)
        if isinstance(body, bytes):
            self.headers["content-length"] = str(len(body))
        self.done = False

    async def __call__(self, scope, receive, send) -> None:
        finished = False  # stays False when the client left (the watcher cancelled the group)
        async with anyio.create_task_group() as group:
            group.start_soon(self._watch, receive, group.cancel_scope)
            await asyncio.sleep(self.behaviour.first_byte_delay)
            await send({"type": "http.response.start", "status": self.status,
                        "headers": [(k.lower().encode(), v.encode()) for k, v in self.headers.items()]})
            finished = await self._send_body(send)
            self.done = True
            group.cancel_scope.cancel()
        if finished:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send_body(self, send) -> bool:
        chunks = _single(self.body) if isinstance(self.body, bytes) else self.body
        try:
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except DropConnection:
            return False
        return True

    async def _watch(self, receive, cancel_scope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self.done:
            self.behaviour.disconnects += 1
        cancel_scope.cancel()


async def _single(body: bytes) -> AsyncIterator[bytes]:
    yield body


class _QuietDrops(logging.Filter):
    """Hide uvicorn's complaint about the responses we cut on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "without completing response" not in record.getMessage()


logging.getLogger("uvicorn.error").addFilter(_QuietDrops())


def json_reply(behaviour: Behaviour, value: Any, status: int = 200, headers: dict[str, str] | None = None,
               content_type: str = "application/json") -> Reply:
    return Reply(behaviour, status, {"content-type": content_type, **(headers or {})}, dumps(value).encode())


def text_reply(behaviour: Behaviour, text: str, status: int = 200, content_type: str | None = None) -> Reply:
    return Reply(behaviour, status, {"content-type": content_type} if content_type else {}, text.encode())


def retry_headers(behaviour: Behaviour, status: int) -> dict[str, str]:
    if behaviour.retry_after is not None and status in (429, 503):
        return {"retry-after": behaviour.retry_after}
    return {}


async def read_request(request: Request, behaviour: Behaviour) -> Any:
    """The parsed JSON body (or ``None`` when it isn't JSON), logged in ``behaviour.requests``."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    entry = dict(body) if isinstance(body, dict) else {"raw": raw.decode("utf-8", "replace")}
    behaviour.requests.append({**entry, "path": request.url.path, "headers": dict(request.headers)})
    return body


@dataclass
class Wire:
    """How one backend frames a token stream; each callable returns the bytes to send.

    ``error`` is ``None`` for a backend that reports a mid-stream failure by cutting the connection.
    ``tail`` follows an error or malformed event (``data: [DONE]`` for the OpenAI-style servers).
    """

    token: Callable[[int], bytes]
    finish: Callable[[], bytes]
    error: Callable[[str], bytes] | None
    malformed: bytes
    tail: bytes = b""


async def drive(behaviour: Behaviour, total: int, wire: Wire) -> AsyncIterator[bytes]:
    """Token events paced by ``token_delay``, with the Behaviour's mid-stream fault at its place."""
    for sent in range(total + 1):
        fault = behaviour.stream_fault(sent, total)
        if fault == "drop" or (fault == "fail" and wire.error is None):
            raise DropConnection
        if fault == "fail":
            yield wire.error(behaviour.fail_message) + wire.tail
            return
        if fault == "malformed":
            yield wire.malformed + wire.tail
            return
        if sent == total:
            break
        await asyncio.sleep(behaviour.token_delay)
        yield wire.token(sent)
    yield wire.finish()


async def cut_body(body: bytes) -> AsyncIterator[bytes]:
    """Half of a non-streamed body, then the connection is cut (``drop_after`` without streaming)."""
    yield body[: len(body) // 2]
    raise DropConnection


def dropped_reply(behaviour: Behaviour, value: Any) -> Reply:
    """Headers promising the full JSON body, half of it, then a cut connection."""
    body = dumps(value).encode()
    headers = {"content-type": "application/json", "content-length": str(len(body))}
    return Reply(behaviour, 200, headers, cut_body(body))
