"""The floor of the stack `infer serve` is built on: a bare ASGI proxy, for bench/gateway_overhead.py's reference side.

    python bench/minimal_proxy.py BACKEND_URL PORT

uvicorn (uvloop + httptools, access log off) running a 40-line ASGI app with no framework, no
validation, no ledger and no metrics: ``POST /v1/chat/completions`` is forwarded as is (model
renamed to ``fast``) through one pooled aiohttp session; a stream is relayed one SSE line per ASGI
send. What it adds over direct is what uvicorn + aiohttp cost by themselves on this machine; what
``infer serve`` adds beyond it is the gateway's own work.
"""

from __future__ import annotations

import json
import sys

import aiohttp
import uvicorn


class MinimalProxy:
    def __init__(self, backend: str) -> None:
        self.backend = backend.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["path"] == "/":
            await self.reply(send, 200, b"text/plain", b"ok")
        else:
            await self.forward(receive, send)

    async def lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def reply(self, send, status: int, content_type: bytes, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]})
        await send({"type": "http.response.body", "body": body})

    async def forward(self, receive, send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = {**json.loads(body), "model": "fast"}
        async with self.session.post(self.backend + "/v1/chat/completions", json=request) as resp:
            if not request.get("stream"):
                await self.reply(send, resp.status, b"application/json", await resp.read())
                return
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(b"content-type", b"text/event-stream")]})
            async for line in resp.content:
                if line.startswith(b"data:"):
                    await send({"type": "http.response.body", "body": line + b"\n", "more_body": True})
            await send({"type": "http.response.body", "body": b""})


if __name__ == "__main__":
    uvicorn.run(MinimalProxy(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning",
                access_log=False)
