"""Wire framings: NDJSON (Ollama), server-sent events (OpenAI chat, with ``data: [DONE]``) and named
server-sent events (Anthropic Messages, OpenAI Responses), one piece per event.

The response reads its events itself (no task between it and the backend): :func:`coalesced` joins the
pieces that are ready together (the next read finishes without waiting) into one write, and writes what
it holds as soon as the next read would wait. When the client disconnects, :class:`Stream` calls the
response's ``hang_up``: the recorder's generation cancels its request (``request.cancel``), so the
backend stops generating, frees its slot and ends with its cancelled record, read to the end.

The framing's last piece (``data: [DONE]``, or what was held with it) is marked :class:`Final` and
sent with the end of the body, so the chunked encoding's terminator leaves in the same write: a
client that stops reading at ``[DONE]`` then finds the response complete and keeps its connection
(with the terminator in a later write, aiohttp closes it and opens a new one per request).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from fastapi.responses import StreamingResponse

from gateway.http.errors import error_body, to_status_message
from gateway.http.jsonwire import dumps

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"
AHEAD = 64  # the most pieces one write joins (and so the most read ahead of a slow client)


class Final(bytes):
    """The body's last piece: sent with ``more_body: False`` (one write with the terminator)."""


class Stream(StreamingResponse):
    """Starlette's StreamingResponse with a cheaper disconnect watch: one watcher task that, when
    ``http.disconnect`` arrives, calls ``hang_up`` (the generation's: its backend stops and its stream
    ends with the cancelled record, which the body reads to its end) or else cancels the sending task,
    instead of an anyio task group of two per response (uvicorn speaks ASGI 2.3, where a send to a
    gone client is silently dropped)."""

    def __init__(self, *args, hang_up: Callable[[], None] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.hang_up = hang_up

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
            if self.hang_up is not None:
                self.hang_up()
            else:
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
        # read to its end, or closed here: the read in progress stopped, then the framing (its finally blocks)
        async with aclosing(self.body_iterator), aclosing(coalesced(self.body_iterator)) as writes:
            async for chunk in writes:
                ended = type(chunk) is Final
                await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def ndjson_response(objects: AsyncIterator[dict], status_code: int = 200, headers: dict[str, str] | None = None,
                   hang_up: Callable[[], None] | None = None) -> StreamingResponse:
    async def lines() -> AsyncIterator[bytes]:
        try:
            async for obj in objects:
                yield dumps(obj) + b"\n"
        except Exception as exc:  # headers are sent: the error becomes the last line
            yield dumps(_error(exc, "/api")) + b"\n"
    return Stream(lines(), status_code=status_code, media_type=NDJSON, headers=headers, hang_up=hang_up)


def sse_response(objects: AsyncIterator[dict], headers: dict[str, str] | None = None,
                 hang_up: Callable[[], None] | None = None) -> StreamingResponse:
    """``data: <json>\\n\\n`` per object, then ``data: [DONE]\\n\\n``, always."""
    async def events() -> AsyncIterator[bytes]:
        try:
            async for obj in objects:
                yield b"data: " + dumps(obj) + b"\n\n"
        except Exception as exc:  # headers are sent: the error is the last event before [DONE]
            yield b"data: " + dumps(_error(exc, "/v1")) + b"\n\n"
        yield Final(b"data: [DONE]\n\n")
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})}
    return Stream(events(), media_type=SSE, headers=headers, hang_up=hang_up)


def event_stream_response(events: AsyncIterator[tuple[str, dict]], *, error: Callable[[Exception], tuple[str, dict]],
                          last: frozenset[str], hang_up: Callable[[], None] | None = None) -> StreamingResponse:
    """Named server-sent events, as Anthropic's Messages and OpenAI's Responses stream them:
    ``event: <name>\ndata: <json>\n\n`` per ``(name, object)``; no ``[DONE]``. A failure after the
    headers becomes the event ``error(exc)`` makes; an event named in ``last`` ends the body."""
    async def frames() -> AsyncIterator[bytes]:
        try:
            async for name, obj in events:
                piece = b"event: " + name.encode() + b"\ndata: " + dumps(obj) + b"\n\n"
                if name in last:
                    yield Final(piece)
                    return
                yield piece
        except Exception as exc:  # headers are sent: the error is the last event
            name, obj = error(exc)
            yield b"event: " + name.encode() + b"\ndata: " + dumps(obj) + b"\n\n"
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return Stream(frames(), media_type=SSE, headers=headers, hang_up=hang_up)


async def coalesced(pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``pieces`` joined into one write while the next is ready without waiting (at most ``AHEAD`` a write): what
    arrived together leaves together, and nothing waits to be batched (vLLM's output handler hands a request
    every output of an engine step at once). The body's last piece is :class:`Final`.

    Each read (``anext(pieces)``) is run at once as far as it goes; one that has to wait is :class:`_Waiting`:
    what is held is written first, then the read goes on where it stopped."""
    held: list[bytes] = []
    while True:
        read = pieces.__anext__()
        try:
            waits_on = read.send(None)
        except StopIteration as ready:
            piece = ready.value
            if len(held) >= AHEAD:
                yield b"".join(held)
                held.clear()
        except StopAsyncIteration:
            break
        else:
            rest = _Waiting(read, waits_on)
            if held:
                try:
                    yield b"".join(held)
                except BaseException:  # the response ends here (closed): the read in progress stops too
                    await rest.stop()
                    raise
                held.clear()
            try:
                piece = await rest
            except StopAsyncIteration:
                break
        held.append(piece)
        if type(piece) is Final:
            yield Final(b"".join(held))
            held.clear()
    if held:
        yield Final(b"".join(held))


class _Waiting:
    """A read that stopped to wait on ``waits_on`` (a future, or None for a bare yield: ``sleep(0)``). Awaiting
    this goes on exactly where it stopped, as ``await anext(source)`` would have: the task waits on the same
    future, and a cancellation or an error thrown in reaches the read where it waits."""

    __slots__ = ("_read", "_waits_on", "_done")

    def __init__(self, read, waits_on):
        self._read, self._waits_on, self._done = read, waits_on, False

    def __await__(self):
        waits_on = self._waits_on
        try:
            while True:
                try:
                    sent = yield waits_on
                except BaseException as exc:
                    waits_on = self._read.throw(exc)
                else:
                    waits_on = self._read.send(sent)
        except StopIteration as ready:
            return ready.value
        finally:
            self._done = True

    async def stop(self) -> None:
        """Cancel a read left waiting (its source's ``finally`` blocks run) and let it end."""
        if self._done:
            return
        try:
            self._waits_on = self._read.throw(asyncio.CancelledError())
        except BaseException:  # it ended at once
            self._done = True
            return
        try:
            await self
        except (Exception, asyncio.CancelledError):
            pass


def _error(exc: Exception, path: str) -> dict:
    status, message, extra = to_status_message(exc)
    return error_body(path, status, message, **extra)
