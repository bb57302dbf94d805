"""Wire framings: NDJSON (Ollama) and server-sent events (OpenAI), flushed per chunk.

Starlette cancels the body iterator when the client disconnects; the recorder's generation then
cancels its request (``request.cancel``), so the backend stops generating and frees its slot.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from gateway.http.errors import error_body, to_status_message
from gateway.http.jsonwire import dumps

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"


def _never() -> bool:
    return False


def ndjson_response(objects: AsyncIterator[dict], status_code: int = 200,
                   more_ready: Callable[[], bool] = _never) -> StreamingResponse:
    async def lines() -> AsyncIterator[bytes]:
        try:
            async for obj in objects:
                yield dumps(obj) + b"\n"
        except Exception as exc:  # headers are sent: the error becomes the last line
            yield dumps(_error(exc, "/api")) + b"\n"
    return StreamingResponse(_coalesced(lines(), more_ready), status_code=status_code, media_type=NDJSON)


def sse_response(objects: AsyncIterator[dict], more_ready: Callable[[], bool] = _never) -> StreamingResponse:
    """``data: <json>\\n\\n`` per object, then ``data: [DONE]\\n\\n``, always."""
    async def events() -> AsyncIterator[bytes]:
        try:
            async for obj in objects:
                yield b"data: " + dumps(obj) + b"\n\n"
        except Exception as exc:  # headers are sent: the error is the last event before [DONE]
            yield b"data: " + dumps(_error(exc, "/v1")) + b"\n\n"
        yield b"data: [DONE]\n\n"
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(_coalesced(events(), more_ready), media_type=SSE, headers=headers)


async def _coalesced(pieces: AsyncIterator[bytes], more_ready: Callable[[], bool]) -> AsyncIterator[bytes]:
    """One write for the pieces that are ready together: a piece is held only while ``more_ready()``
    says the next event has already arrived, so nothing ever waits to be batched."""
    held: list[bytes] = []
    async for piece in pieces:
        held.append(piece)
        if not more_ready():
            yield b"".join(held)
            held.clear()
    if held:
        yield b"".join(held)


def _error(exc: Exception, path: str) -> dict:
    status, message, extra = to_status_message(exc)
    return error_body(path, status, message, **extra)
