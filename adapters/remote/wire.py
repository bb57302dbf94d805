"""Reading streamed replies off the wire: server-sent events and NDJSON.

Parsing rules shared by every remote adapter (serving-protocols.md §6): ``data:`` with or without
the space, ``:`` comment lines and ``event:``/``id:`` fields skipped, events end at a blank line,
several ``data:`` lines in one event are joined with ``\\n``. A stream that ends without a blank
line still yields its last event (TGI and Triton close the connection after their final event).

    async with aclosing(sse_data(response)) as events:   # closed when left early: no generator
        async for payload in events:                       # for the garbage collector to finalize
            ...                                            # str per event, "[DONE]" included
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import orjson

from core.errors import BackendProtocolError

from .client import Response


async def sse_data(response: Response) -> AsyncIterator[str]:
    """The ``data`` payload of each server-sent event."""
    async with aclosing(sse_batches(response)) as batches:
        async for batch in batches:
            for data in batch:
                yield data


async def sse_batches(response: Response) -> AsyncIterator[list[str]]:
    """The ``data`` payloads of the events each block read off the socket completes (one generator
    step per block, not per event or line; lines stay bytes until an event's payload is decoded)."""
    event: list[bytes] = []
    async with aclosing(_line_batches(response)) as batches:
        async for lines in batches:
            out = []
            for line in lines:
                if not line:
                    if event:
                        out.append(_payload(event))
                        event = []
                    continue
                if line[0] == 58:  # ":" a comment
                    continue
                field, _, value = line.partition(b":")
                if field == b"data":
                    event.append(value[1:] if value[:1] == b" " else value)
            if out:
                yield out
    if event:
        yield [_payload(event)]


def _payload(event: list[bytes]) -> str:
    return (event[0] if len(event) == 1 else b"\n".join(event)).decode("utf-8", "replace")


async def _line_batches(response: Response) -> AsyncIterator[list[bytes]]:
    """The complete lines (without ``\\n``, ``\\r\\n`` or a lone ``\\r``) of each block read off the
    socket (``aiter_bytes``)."""
    held = b""
    async with aclosing(response.aiter_bytes()) as blocks:
        async for block in blocks:
            text = held + block
            *lines, held = text.split(b"\n")
            if lines:
                yield _without_cr(lines) if b"\r" in text else lines
    if held:
        yield _without_cr([held])


def _without_cr(lines: list[bytes]) -> list[bytes]:
    out = []
    for line in lines:
        if line.endswith(b"\r"):
            line = line[:-1]
        out.extend(line.split(b"\r"))  # a lone CR ends a line too (SSE)
    return out


async def ndjson_objects(response: Response) -> AsyncIterator[dict[str, Any]]:
    """One JSON object per non-empty line (Ollama's streaming format)."""
    async with aclosing(_line_batches(response)) as batches:
        async for batch in batches:
            for line in batch:
                if line.strip():
                    yield parse_json(line.decode("utf-8", "replace"))


def parse_json(text: str | bytes, what: str = "reply") -> Any:
    try:
        return orjson.loads(text)
    except (orjson.JSONDecodeError, UnicodeDecodeError):
        snippet = text[:200] if isinstance(text, str) else text[:200].decode("utf-8", "replace")
        raise BackendProtocolError(f"malformed {what} from the backend (not JSON): {snippet!r}") from None


def parse_object(text: str | bytes, what: str = "event") -> dict[str, Any]:
    value = parse_json(text, what)
    if not isinstance(value, dict):
        raise BackendProtocolError(f"malformed {what} from the backend: expected a JSON object, got {str(value)[:200]!r}")
    return value
