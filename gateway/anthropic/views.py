"""What ``POST /v1/messages`` answers: the Message object, and the events of its stream.

Content blocks come in the order the model wrote them: ``thinking`` (with a ``signature``: opaque,
for clients that send thinking blocks back; this server does not check it), ``text``, then one
``tool_use`` block per call (``input`` the arguments object).

A stream is Anthropic's event sequence::

    message_start (usage with output_tokens 0), ping,
    per block: content_block_start, content_block_delta… (thinking_delta + signature_delta | text_delta |
               input_json_delta), content_block_stop,
    message_delta (stop_reason, stop_sequence, usage: the final counts), message_stop

``message_start`` waits for the first event (the gateway has it already: errors come before headers)
and says the prompt's ``input_tokens`` when that event knows them (a Done, or a first chunk from a
backend that reports usage early, as vLLM does with ``continuous_usage_stats``), else 0;
``message_delta`` carries the final counts, which the SDKs take as the final count.
``stop_reason``: ``tool_use`` after calls, ``max_tokens`` when cut, ``stop_sequence`` when one of the
request's ``stop_sequences`` ended it (the backend says which), else ``end_turn``.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

from core.base import Chunk, Done, StreamEvent, ToolCall
from frontend.tools.wire import arguments_object

Event = tuple[str, dict[str, Any]]


def message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def signature() -> str:
    return "infer-" + secrets.token_hex(16)


def usage(done: Done | None) -> dict[str, Any]:
    """Anthropic's usage: ``input_tokens`` excludes what the prompt cache served (``cache_read_input_tokens``)."""
    if done is None:
        return {"input_tokens": 0, "output_tokens": 0}
    u = done.usage
    cached = u.cached_input_tokens or 0
    out: dict[str, Any] = {"input_tokens": max(0, u.input_tokens - cached), "output_tokens": u.output_tokens,
                           "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}
    if u.reasoning_tokens is not None:
        out["output_tokens_details"] = {"thinking_tokens": u.reasoning_tokens}
    return out


def stop(done: Done, called: bool, stop_sequences: Sequence[str] | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence)."""
    if called and done.finish_reason != "length":
        return "tool_use", None
    if done.finish_reason == "length":
        return "max_tokens", None
    if done.stop_sequence is not None and done.stop_sequence in (stop_sequences or ()):
        return "stop_sequence", done.stop_sequence
    return "end_turn", None


def envelope(msg_id: str, model: str) -> dict[str, Any]:
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": []}


def message(msg_id: str, model: str, chunks: Sequence[Chunk], done: Done,
            stop_sequences: Sequence[str] | None) -> dict[str, Any]:
    """The non-streamed answer."""
    thinking = "".join(c.thinking for c in chunks)
    text = "".join(c.text for c in chunks)
    calls = [call for c in chunks for call in c.tool_calls]
    content: list[dict[str, Any]] = []
    if thinking:
        content.append({"type": "thinking", "thinking": thinking, "signature": signature()})
    if text or not (thinking or calls):
        content.append({"type": "text", "text": text})
    content += [tool_use(call) for call in calls]
    reason, sequence = stop(done, bool(calls), stop_sequences)
    return {**envelope(msg_id, model), "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": usage(done)}


def tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments_object(call)}


class _Blocks:
    """The open content block of a stream: its kind and index."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.index = -1

    def switch(self, kind: str, start: dict[str, Any]) -> list[Event]:
        """Events that close the open block and open one of ``kind`` (none when it is already open)."""
        if self.kind == kind and kind != "tool_use":
            return []
        events = self.close()
        self.kind, self.index = kind, self.index + 1
        events.append(("content_block_start", {"type": "content_block_start", "index": self.index,
                                               "content_block": start}))
        return events

    def delta(self, delta: dict[str, Any]) -> Event:
        return "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}

    def close(self) -> list[Event]:
        if self.kind is None:
            return []
        events = [self.delta({"type": "signature_delta", "signature": signature()})] if self.kind == "thinking" else []
        events.append(("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.kind = None
        return events


async def stream_events(msg_id: str, model: str, events: AsyncIterator[StreamEvent],
                        stop_sequences: Sequence[str] | None) -> AsyncIterator[Event]:
    first = await anext(events, None)
    start = {**envelope(msg_id, model), "stop_reason": None, "stop_sequence": None, "usage": start_usage(first)}
    yield "message_start", {"type": "message_start", "message": start}
    yield "ping", {"type": "ping"}
    blocks, called = _Blocks(), False
    async for event in _chain(first, events):
        if isinstance(event, Done):
            for out in blocks.close():
                yield out
            reason, sequence = stop(event, called, stop_sequences)
            delta = {"stop_reason": reason, "stop_sequence": sequence}
            yield "message_delta", {"type": "message_delta", "delta": delta, "usage": usage(event)}
            yield "message_stop", {"type": "message_stop"}
            return
        for out in _chunk_events(blocks, event):
            yield out
        called = called or bool(event.tool_calls)


def start_usage(first: StreamEvent | None) -> dict[str, Any]:
    """``message_start``'s usage: the prompt's size when the first event knows it, no output yet."""
    if isinstance(first, Done):
        return {**usage(first), "output_tokens": 0}
    if first is not None and first.input_tokens is not None:
        return {"input_tokens": first.input_tokens, "output_tokens": 0}
    return usage(None)


async def _chain(first: StreamEvent | None, events: AsyncIterator[StreamEvent]) -> AsyncIterator[StreamEvent]:
    if first is None:
        return
    yield first
    async for event in events:
        yield event


def _chunk_events(blocks: _Blocks, chunk: Chunk) -> list[Event]:
    events: list[Event] = []
    if chunk.thinking:
        events += blocks.switch("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        events.append(blocks.delta({"type": "thinking_delta", "thinking": chunk.thinking}))
    if chunk.text:
        events += blocks.switch("text", {"type": "text", "text": ""})
        events.append(blocks.delta({"type": "text_delta", "text": chunk.text}))
    for call in chunk.tool_calls:
        arguments_object(call)  # a backend's call whose arguments are no object is its protocol error
        events += blocks.switch("tool_use", {"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
        events.append(blocks.delta({"type": "input_json_delta", "partial_json": call.arguments}))
    return events
