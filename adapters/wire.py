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

import httpx
import orjson

from .errors import BackendProtocolError


async def sse_data(response: httpx.Response) -> AsyncIterator[str]:
    """The ``data`` payload of each server-sent event."""
    lines: list[str] = []
    async with aclosing(_line_batches(response)) as batches:
        async for batch in batches:
            for line in batch:
                if not line:
                    if lines:
                        yield "\n".join(lines)
                        lines = []
                    continue
                if line.startswith(":"):
                    continue
                field, _, value = line.partition(":")
                if field == "data":
                    lines.append(value[1:] if value.startswith(" ") else value)
    if lines:
        yield "\n".join(lines)


def _line_batches(response: httpx.Response) -> AsyncIterator[list[str]]:
    """The lines as they arrive together: a direct aiohttp reply gives one list per block read (no
    generator step per line); an httpx reply one list per line."""
    batches = getattr(response, "aiter_line_batches", None)
    return batches() if batches is not None else _one_each(response.aiter_lines())


async def _one_each(lines: AsyncIterator[str]) -> AsyncIterator[list[str]]:
    async with aclosing(lines):
        async for line in lines:
            yield [line]


async def ndjson_objects(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """One JSON object per non-empty line (Ollama's streaming format)."""
    async with aclosing(_line_batches(response)) as batches:
        async for batch in batches:
            for line in batch:
                if line.strip():
                    yield parse_json(line)


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
