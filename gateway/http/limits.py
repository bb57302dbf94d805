"""Bounds on one request's work, checked before anything expensive, so no caller stalls the others.

The gateway serves every client from one event loop: a request whose parsing, validation or
rendering holds it for seconds delays every other answer (``/health`` included). For the routes
that take a prompt (:data:`PROMPT_ROUTES`), :class:`RequestBounds` (an ASGI middleware inside the
guards, which already refused a body over ``max_prompt_bytes``, 8 MiB, with 413: orjson takes about
4 ms a MB, all of it holding the loop):

- parses the body once (the hot routes and the FastAPI routes reuse the object, ``scope[PARSED]``):
  with orjson on the loop (about 10x the standard library's speed, and it refuses lone surrogates,
  so the models' surrogate walk is skipped) when the body holds at most ``ON_LOOP_OBJECTS`` JSON
  objects; a body with more (orjson's time grows with the objects: 10,000 tools take 200 ms) is
  parsed on a worker thread by the standard library's Python scanner, which gives the loop the GIL
  every few milliseconds (``gateway/app.py`` freezes the startup heap out of Python's full garbage
  collections, each of which would otherwise hold the loop about 70 ms amid so many new objects);
- refuses, before any validation, a body with more than ``max_messages`` messages (``messages``, or
  the Responses API's ``input`` items) or more than ``max_tools`` tools: 413 in the API's error
  shape, naming the limit and the setting that raises it.

What is left per request is bounded by those counts and the body limit. The work that still grows
with them runs off the loop: translating a body with many tools or messages (:func:`translated`:
each tool's JSON Schema is checked, ~1 ms apiece), and counting a prompt's tokens
(``gateway/serving/prompt_tokens.py``, in bounded pieces).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Callable
from json.scanner import py_make_scanner
from typing import Any, TypeVar

import orjson
from fastapi.routing import APIRoute

from gateway.http.bodies import check_text, strictly_parsed
from gateway.http.errors import error_body

PROMPT_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                           "/v1/messages/count_tokens", "/api/chat", "/api/generate"})
PARSED = "infer.parsed_body"  # scope key: the request's body, parsed
STRICT = "infer.parsed_strictly"  # scope key: True when no lone surrogate can be in it (orjson refuses them)
ON_LOOP_OBJECTS = 20_000  # JSON objects a body may hold to be parsed on the loop (orjson: well under 50 ms)
OFF_LOOP_ITEMS = 64  # a body with more messages or tools than this is translated on a worker thread

T = TypeVar("T")


class RequestBounds:
    def __init__(self, app, max_messages: int, max_tools: int):
        self.app = app
        self.max_messages, self.max_tools = max_messages, max_tools

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in PROMPT_ROUTES:
            return await self.app(scope, receive, send)
        messages, body = await read_body(receive)
        data, strict = None, True
        if messages[-1]["type"] == "http.request":
            if num_objects(body) <= ON_LOOP_OBJECTS:
                data = parse_object(body)
            else:
                data, strict = await asyncio.to_thread(parse_in_python, body)
        if data is not None:
            refusal = self.refusal(data)
            if refusal is not None:
                return await _refuse(send, scope["path"], refusal)
            scope = {**scope, PARSED: data, STRICT: strict}
        await self.app(scope, replay(messages, receive), send)

    def refusal(self, data: dict[str, Any]) -> str | None:
        """Why the body is over a count limit, or None."""
        for field in ("messages", "input"):
            items = data.get(field)
            if isinstance(items, list) and len(items) > self.max_messages:
                return (f"'{field}' has {len(items)} items; the most one request may send is {self.max_messages} "
                        "(INFER_MAX_MESSAGES)")
        tools = data.get("tools")
        if isinstance(tools, list) and len(tools) > self.max_tools:
            return f"'tools' has {len(tools)} tools; the most one request may send is {self.max_tools} (INFER_MAX_TOOLS)"
        return None


def items(*lists: list | None) -> int:
    """How many messages and tools a body carries (what its translation's work grows with)."""
    return sum(len(x) for x in lists if isinstance(x, list))


async def translated(build: Callable[..., T], *args: Any, items: int) -> T:
    """``build(*args)``: a body's translation (tool schemas checked, messages mapped), on a worker thread
    when it carries more than ``OFF_LOOP_ITEMS`` messages and tools (pure Python there gives the loop the
    GIL every few milliseconds); small bodies are translated at once."""
    if items > OFF_LOOP_ITEMS:
        return await asyncio.to_thread(contextvars.copy_context().run, build, *args)
    return build(*args)


class ParsedBodyRoute(APIRoute):
    """A FastAPI route that takes the body :class:`RequestBounds` already parsed instead of parsing it
    again with the standard library (Starlette's ``Request.json`` caches its answer in ``_json``)."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def parsed_once(request):
            data = request.scope.get(PARSED)
            if data is None:
                return await handler(request)
            request._json = data
            token = strictly_parsed.set(request.scope.get(STRICT, False))
            try:
                return await handler(request)
            finally:
                strictly_parsed.reset(token)
        return parsed_once


async def read_body(receive) -> tuple[list[dict], bytes]:
    """Every ASGI message of the body (to replay) and its bytes."""
    messages, parts = [], []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, b""
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return messages, b"".join(parts)


def num_objects(body: bytes) -> int:
    """About how many JSON objects ``body`` holds, at C speed: ``{`` followed by a key's quote (inside a
    string that quote would be escaped, so only a string ending in ``{`` is miscounted)."""
    return body.count(b'{"') + body.count(b'{ "') + body.count(b"{\n")


def parse_in_python(body: bytes) -> tuple[dict[str, Any] | None, bool]:
    """``body`` parsed by the standard library's pure-Python scanner (for a worker thread), and whether
    it is free of lone surrogates (as orjson would have made sure; else the models' walk refuses it)."""
    decoder = json.JSONDecoder()
    decoder.scan_once = py_make_scanner(decoder)
    try:
        data = decoder.decode(body.decode("utf-8"))
    except (ValueError, RecursionError):
        return None, False
    if not isinstance(data, dict):
        return None, False
    try:
        check_text(data)
    except ValueError:
        return data, False
    return data, True


def parse_object(body: bytes) -> dict[str, Any] | None:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def replay(messages: list[dict], receive):
    pending = list(messages)

    async def replayed() -> dict:
        return pending.pop(0) if pending else await receive()
    return replayed


async def _refuse(send, path: str, message: str) -> None:
    body = orjson.dumps(error_body(path, 413, message))
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
