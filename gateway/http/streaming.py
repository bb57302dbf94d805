"""Wire framings: NDJSON (Ollama), server-sent events (OpenAI chat, with ``data: [DONE]``) and named
server-sent events (Anthropic Messages, OpenAI Responses), flushed per chunk.

The body iterator is cancelled when the client disconnects (:class:`Stream`); the recorder's
generation then cancels its request (``request.cancel``), so the backend stops generating and
frees its slot.

The framing's last piece (``data: [DONE]``, or what was held with it) is marked :class:`Final` and
sent with the end of the body, so the chunked encoding's terminator leaves in the same write: a
client that stops reading at ``[DONE]`` then finds the response complete and keeps its connection
(with the terminator in a later write, aiohttp closes it and opens a new one per request).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from gateway.http.errors import error_body, to_status_message
from gateway.http.jsonwire import dumps

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"


def _never() -> bool:
    return False


class Final(bytes):
    """The body's last piece: sent with ``more_body: False`` (one write with the terminator)."""


class Stream(StreamingResponse):
    """Starlette's StreamingResponse with a cheaper disconnect watch: one watcher task that cancels
    the sending task when ``http.disconnect`` arrives, instead of an anyio task group of two per
    response (uvicorn speaks ASGI 2.3, where a send to a gone client is silently dropped)."""

    async def __call__(self, scope, receive, send) -> None:
        sender = asyncio.current_task()
        gone = False

        async def watch() -> None:
            nonlocal gone
            try:
                while (await receive())["type"] != "http.disconnect":
                    pass
            except Exception:  # nothing more to hear from this connection
                return
            gone = True
            sender.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not gone:
                raise
            sender.uncancel()  # the client left: the answer ends here, as Starlette's does
        finally:
            watcher.cancel()
        if self.background is not None:
            await self.background()

    async def stream_response(self, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        ended = False
        async for chunk in self.body_iterator:  # read to its end: no generator left to the finalizer
            ended = type(chunk) is Final
            await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def ndjson_response(objects: AsyncIterator[dict], status_code: int = 200,
                   more_ready: Callable[[], bool] = _never, headers: dict[str, str] | None = None) -> StreamingResponse:
    async def lines() -> AsyncIterator[bytes]:
        held = _Held(more_ready)
        try:
            async for obj in objects:
                if (ready := held.add(dumps(obj) + b"\n")) is not None:
                    yield ready
        except Exception as exc:  # headers are sent: the error becomes the last line
            if (ready := held.add(dumps(_error(exc, "/api")) + b"\n")) is not None:
                yield ready
        if held.pieces:
            yield Final(held.take())
    return Stream(lines(), status_code=status_code, media_type=NDJSON, headers=headers)


def sse_response(objects: AsyncIterator[dict], more_ready: Callable[[], bool] = _never,
                 headers: dict[str, str] | None = None) -> StreamingResponse:
    """``data: <json>\\n\\n`` per object, then ``data: [DONE]\\n\\n``, always."""
    async def events() -> AsyncIterator[bytes]:
        held = _Held(more_ready)
        try:
            async for obj in objects:
                if (ready := held.add(b"data: " + dumps(obj) + b"\n\n")) is not None:
                    yield ready
        except Exception as exc:  # headers are sent: the error is the last event before [DONE]
            if (ready := held.add(b"data: " + dumps(_error(exc, "/v1")) + b"\n\n")) is not None:
                yield ready
        if (ready := held.add(b"data: [DONE]\n\n")) is not None:
            yield Final(ready)
        if held.pieces:
            yield Final(held.take())
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})}
    return Stream(events(), media_type=SSE, headers=headers)


def event_stream_response(events: AsyncIterator[tuple[str, dict]], *, error: Callable[[Exception], tuple[str, dict]],
                          last: frozenset[str], more_ready: Callable[[], bool] = _never) -> StreamingResponse:
    """Named server-sent events, as Anthropic's Messages and OpenAI's Responses stream them:
    ``event: <name>\ndata: <json>\n\n`` per ``(name, object)``; no ``[DONE]``. A failure after the
    headers becomes the event ``error(exc)`` makes; an event named in ``last`` ends the body."""
    async def frames() -> AsyncIterator[bytes]:
        held = _Held(more_ready)
        try:
            async for name, obj in events:
                piece = b"event: " + name.encode() + b"\ndata: " + dumps(obj) + b"\n\n"
                if name in last:
                    yield Final(held.take() + piece if held.pieces else piece)
                    return
                if (ready := held.add(piece)) is not None:
                    yield ready
        except Exception as exc:  # headers are sent: the error is the last event
            name, obj = error(exc)
            held.pieces.append(b"event: " + name.encode() + b"\ndata: " + dumps(obj) + b"\n\n")
        if held.pieces:
            yield Final(held.take())
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return Stream(frames(), media_type=SSE, headers=headers)


class _Held:
    """One write for the pieces that are ready together: a piece is held only while ``more_ready()``
    says the next event has already arrived, so nothing ever waits to be batched. (Kept inside the
    framing generators: one async generator less per chunk.)"""

    __slots__ = ("more_ready", "pieces")

    def __init__(self, more_ready: Callable[[], bool]):
        self.more_ready = more_ready
        self.pieces: list[bytes] = []

    def add(self, piece: bytes) -> bytes | None:
        """``piece`` held, or what to write now (the held pieces and ``piece``)."""
        if self.more_ready():
            self.pieces.append(piece)
            return None
        if not self.pieces:
            return piece
        self.pieces.append(piece)
        return self.take()

    def take(self) -> bytes:
        out = b"".join(self.pieces)
        self.pieces.clear()
        return out


def _error(exc: Exception, path: str) -> dict:
    status, message, extra = to_status_message(exc)
    return error_body(path, status, message, **extra)
