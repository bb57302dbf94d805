"""The two hot routes, ``POST /v1/chat/completions`` and ``POST /api/chat``, without FastAPI's routing.

An ASGI middleware inside the guards and outside :class:`~gateway.http.bodies.JSONBodies` (which only
FastAPI's routes need): for a hot path with a declared ``Content-Length`` it reads the body, parses it
(orjson, whatever the Content-Type) and hands the object to the handler :func:`hot_route` made of
the route's own request model and serving function (the code the FastAPI route calls too).
Dependency solving, FastAPI's request handler and two middleware layers (about a tenth of the
gateway's CPU per request) are skipped.

Anything that does not parse or validate, and any other request, goes to the FastAPI app with the
body replayed, so error answers (and the OpenAPI schema) stay exactly FastAPI's. Errors raised
while serving are answered by :func:`~gateway.http.errors.known_error_response`, as the app's
exception handlers do; any other exception goes up to the server-error handler, as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.responses import Response

from gateway.deps import client_from
from gateway.http.bodies import PARSED_STRICTLY
from gateway.http.errors import KNOWN, APIError, known_error_response
from gateway.http.hints import hints_from
from gateway.http.limits import PARSED, STRICT, parse_object, read_body, replay

Handler = Callable[[dict, Callable, dict], Awaitable[Response | None]]


def hot_route(model: type[BaseModel], serve: Callable[..., Awaitable[Response]]) -> Handler:
    """A hot handler: ``data`` validated as ``model``, then ``serve(body, router, recorder, client, hints,
    receive)``; None (the request goes to FastAPI) when the body or a hint header does not validate."""
    async def handler(scope: dict, receive: Callable, data: dict) -> Response | None:
        strict = scope.get(STRICT, True) if PARSED in scope else True  # parsed here: by orjson
        try:
            body = model.model_validate(data, context=PARSED_STRICTLY if strict else None)
            headers = Headers(scope=scope)
            hints = hints_from(headers, scope)
        except (ValidationError, APIError):
            return None
        state = scope["app"].state
        return await serve(body, state.router, state.recorder, client_from(headers, scope), hints, receive)
    return handler


class HotRoutes:
    def __init__(self, app, routes: dict[str, Handler]):
        self.app = app
        self.routes = routes

    async def __call__(self, scope, receive, send):
        handler = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if handler is None or not _has_length(scope["headers"]):
            return await self.app(scope, receive, send)
        messages, body = await read_body(receive)
        data = scope.get(PARSED)  # RequestBounds parsed it
        if data is None:
            data = parse_object(body) if messages[-1]["type"] == "http.request" else None
        response = None
        if data is not None:
            try:
                response = await handler(scope, receive, data)
            except KNOWN as exc:
                response = known_error_response(scope["path"], exc)
        if response is None:
            return await self.app(scope, replay(messages, receive), send)
        await response(scope, receive, send)


def _has_length(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(k == b"content-length" for k, _ in headers)
