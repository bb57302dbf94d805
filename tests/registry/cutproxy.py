"""A loopback TCP proxy that cuts blob downloads mid-stream, for resume tests.

It forwards bytes unchanged between a client and an upstream server. For connections whose
request targets a blob, it closes both sides after ``cut_after`` response bytes, for the first
``cuts`` such connections. ``blob_bytes`` counts every response byte sent for blob requests.
"""

from __future__ import annotations

import asyncio
import socket
import threading


class CutProxy:
    def __init__(self, upstream_port: int, *, cut_after: int, cuts: int) -> None:
        self.upstream_port, self.cut_after, self.cuts = upstream_port, cut_after, cuts
        self.blob_bytes = 0
        self.blob_requests = 0
        self._loop = asyncio.new_event_loop()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> "CutProxy":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self._server.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, sock=self._sock)

    async def _handle(self, creader, cwriter) -> None:
        ureader, uwriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        state = {"blob": False, "limit": None, "sent": 0}
        up = asyncio.ensure_future(self._upstream(creader, uwriter, state))
        down = asyncio.ensure_future(self._downstream(ureader, cwriter, state))
        await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
        for writer in (cwriter, uwriter):
            writer.close()

    async def _upstream(self, reader, writer, state) -> None:
        """Client -> server; each new request line decides how its response is treated
        (HTTP/1.1 keep-alive sends requests one after another on one connection)."""
        while data := await reader.read(65536):
            if data[:8].split(b" ")[0] in (b"GET", b"HEAD", b"POST", b"PUT", b"PATCH"):
                line = data.split(b"\r\n", 1)[0]
                state["blob"] = line.startswith(b"GET") and b"/blobs/sha256" in line
                state["sent"], state["limit"] = 0, None
                if state["blob"]:
                    self.blob_requests += 1
                    if self.cuts > 0:
                        self.cuts -= 1
                        state["limit"] = self.cut_after
            writer.write(data)
            await writer.drain()

    async def _downstream(self, reader, writer, state) -> None:
        while data := await reader.read(65536):
            limit = state["limit"]
            if limit is not None:
                data = data[: max(0, limit - state["sent"])]
            writer.write(data)
            await writer.drain()
            state["sent"] += len(data)
            if state["blob"]:
                self.blob_bytes += len(data)
            if limit is not None and state["sent"] >= limit:
                return
