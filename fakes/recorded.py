"""Recorded replies on a real loopback socket: the adapters' translation tests talk HTTP to it.

    server = recorded_server(lambda request: httpx.Response(200, json={...}))   # one per process
    backend = TGIBackend(RemoteSettings(..., base_url=server.url))

The handler takes an ``httpx.Request`` (method, URL, headers, body) and returns an ``httpx.Response``
(status, headers, body): the shapes the tests write their recorded bytes in. One aiohttp server
runs on a thread for the whole process; each test sets its handler.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import httpx
from aiohttp import web

Handler = Callable[[httpx.Request], httpx.Response]
_HOP_BY_HOP = {"content-length", "transfer-encoding", "content-encoding", "connection"}


class RecordedServer:
    def __init__(self) -> None:
        self.handler: Handler = lambda request: httpx.Response(404)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="recorded-server", daemon=True).start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=10)
        self.url = f"http://127.0.0.1:{self.port}"

    async def _start(self) -> int:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner.addresses[0][1]

    async def _answer(self, request: web.Request) -> web.Response:
        asked = httpx.Request(request.method, str(request.url), headers=dict(request.headers),
                              content=await request.read())
        reply = self.handler(asked)
        headers = {k: v for k, v in reply.headers.items() if k.lower() not in _HOP_BY_HOP}
        return web.Response(status=reply.status_code, body=reply.content, headers=headers)


_server: RecordedServer | None = None


def recorded_server(handler: Handler) -> RecordedServer:
    """The process's server, answering with ``handler`` from now on."""
    global _server
    if _server is None:
        _server = RecordedServer()
    _server.handler = handler
    return _server
