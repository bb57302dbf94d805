"""The access log: uvicorn's line per request, written once the response has left.

uvicorn writes its access line (``INFO: 127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 200 OK``)
when the status line is sent, before the response's first byte: formatting the record and the
write to stderr are on every client's clock (about 5 % of the gateway's event loop at one client).
:class:`AccessLog`, the outermost ASGI layer of ``infer serve``, writes the same record, with the
same arguments to the same formatter, after the response's last body message was handed to the
transport: the client already has its answer. A streamed response is logged when it ends, as
nginx and most access logs do; a response that never started (the client left first) is not
logged, as uvicorn does not log it either.

:func:`take_over` moves the handlers uvicorn installed on ``uvicorn.access`` (its colours, its
``--log-level``) to ``infer.access`` and leaves uvicorn's logger without any, so uvicorn's own
line is off and each request is logged once.
"""

from __future__ import annotations

import logging

from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

UVICORN = "uvicorn.access"
LOG = logging.getLogger("infer.access")


def take_over() -> None:
    """After uvicorn configured its logging: its access handlers (and level) serve this module's logger."""
    uvicorn = logging.getLogger(UVICORN)
    LOG.handlers, LOG.propagate = list(uvicorn.handlers), uvicorn.propagate
    LOG.setLevel(uvicorn.level)
    uvicorn.handlers, uvicorn.propagate = [], False


class AccessLog:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not LOG.isEnabledFor(logging.INFO):
            return await self.app(scope, receive, send)
        status = None

        async def logged_send(message) -> None:
            nonlocal status
            await send(message)
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
            elif kind == "http.response.body" and not message.get("more_body") and status is not None:
                _line(scope, status)
                status = None  # once

        try:
            await self.app(scope, receive, logged_send)
        finally:
            if status is not None:  # started, never finished (the client left, or an error cut it)
                _line(scope, status)


def _line(scope, status: int) -> None:
    LOG.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope), scope["method"], get_path_with_query_string(scope),
             scope["http_version"], status)
