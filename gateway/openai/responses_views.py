"""What ``POST /v1/responses`` answers: the Response object, its output items, and its stream's events.

Output items in the order the model wrote them: a ``reasoning`` item (the thinking, as its summary
text: local models have no separate summary), a ``message`` (one ``output_text`` part), one
``function_call`` item per call (``call_id`` answers it in a later ``function_call_output``).

A stream is the Responses event sequence, each with a ``sequence_number``::

    response.created, response.in_progress,
    reasoning: output_item.added, reasoning_summary_part.added, reasoning_summary_text.delta…,
               reasoning_summary_text.done, reasoning_summary_part.done, output_item.done
    message:   output_item.added, content_part.added, output_text.delta…, output_text.done,
               content_part.done, output_item.done
    call:      output_item.added, function_call_arguments.delta, function_call_arguments.done, output_item.done
    response.completed (or response.incomplete when max_output_tokens cut it; response.failed on an error)

:func:`conversation_tail` turns the output back into internal messages, for the stored conversation.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.base import Chunk, Done, StreamEvent, ToolCall
from frontend.tools.wire import arguments_object

Event = tuple[str, dict[str, Any]]


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


@dataclass
class ResponseMeta:
    """What every snapshot of one response repeats (the request's settings echoed back)."""

    model: str
    settings: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def snapshot(self, status: str, output: list[dict], done: Done | None = None) -> dict[str, Any]:
        body = {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "error": None, "incomplete_details": None, "model": self.model, "output": output,
                **self.settings, "usage": usage(done) if done is not None else None}
        if status == "incomplete":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        return body


def settings_of(body) -> dict[str, Any]:
    """The request's fields a Response echoes."""
    return {"instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "store": body.store is not False,
            "temperature": body.temperature, "top_p": body.top_p, "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [], "text": body.text or {"format": {"type": "text"}},
            "reasoning": body.reasoning.model_dump() if body.reasoning else {"effort": None, "summary": None},
            "metadata": body.metadata or {}, "user": body.user, "truncation": "disabled", "background": False}


def usage(done: Done) -> dict[str, Any]:
    u = done.usage
    return {"input_tokens": u.input_tokens, "input_tokens_details": {"cached_tokens": u.cached_input_tokens or 0},
            "output_tokens": u.output_tokens, "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens or 0},
            "total_tokens": u.input_tokens + u.output_tokens}


def status_of(done: Done) -> str:
    return "incomplete" if done.finish_reason == "length" else "completed"


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    content = [part] if status == "completed" else []
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def call_item(item_id: str, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if status == "completed" else ""}


def output_items(chunks: Sequence[Chunk]) -> list[dict[str, Any]]:
    thinking = "".join(c.thinking for c in chunks)
    text = "".join(c.text for c in chunks)
    calls = [call for c in chunks for call in c.tool_calls]
    items = [reasoning_item(new_id("rs"), thinking)] if thinking else []
    if text or not calls:
        items.append(message_item(new_id("msg"), text))
    return items + [call_item(new_id("fc"), call) for call in calls]


def conversation_tail(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output as internal messages: one assistant message with its text and calls."""
    text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"],
                           "arguments": arguments_object(ToolCall(item["name"], item["arguments"]))}}
             for item in output if item["type"] == "function_call"]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return [message]


class _Stream:
    """The open output item of a stream, and the events' sequence numbers."""

    def __init__(self) -> None:
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.kind: str | None = None
        self.item: dict[str, Any] = {}
        self.text = ""

    def event(self, kind: str, **fields: Any) -> Event:
        self.sequence += 1
        return kind, {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.item["id"], "output_index": len(self.output)}

    def open(self, kind: str, item: dict[str, Any]) -> list[Event]:
        if self.kind == kind and kind != "function_call":
            return []
        events = self.close()
        self.kind, self.item, self.text = kind, item, ""
        events.append(self.event("response.output_item.added", output_index=len(self.output), item=item))
        if kind == "reasoning":
            events.append(self.event("response.reasoning_summary_part.added", **self._at(), summary_index=0,
                                     part={"type": "summary_text", "text": ""}))
        elif kind == "message":
            events.append(self.event("response.content_part.added", **self._at(), content_index=0,
                                     part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
        return events

    def delta(self, text: str) -> Event:
        self.text += text
        if self.kind == "reasoning":
            return self.event("response.reasoning_summary_text.delta", **self._at(), summary_index=0, delta=text)
        if self.kind == "message":
            return self.event("response.output_text.delta", **self._at(), content_index=0, delta=text, logprobs=[])
        return self.event("response.function_call_arguments.delta", **self._at(), delta=text)

    def close(self) -> list[Event]:
        if self.kind is None:
            return []
        at, text, item = self._at(), self.text, self.item
        if self.kind == "reasoning":
            done = reasoning_item(item["id"], text)
            part = {"type": "summary_text", "text": text}
            events = [self.event("response.reasoning_summary_text.done", **at, summary_index=0, text=text),
                      self.event("response.reasoning_summary_part.done", **at, summary_index=0, part=part)]
        elif self.kind == "message":
            done = message_item(item["id"], text)
            events = [self.event("response.output_text.done", **at, content_index=0, text=text, logprobs=[]),
                      self.event("response.content_part.done", **at, content_index=0, part=done["content"][0])]
        else:
            done = {**item, "status": "completed", "arguments": text}
            events = [self.event("response.function_call_arguments.done", **at, name=item["name"], arguments=text)]
        events.append(self.event("response.output_item.done", output_index=at["output_index"], item=done))
        self.output.append(done)
        self.kind = None
        return events


async def stream_events(meta: ResponseMeta, events: AsyncIterator[StreamEvent], on_done,
                        failure) -> AsyncIterator[Event]:
    """The events of one response; ``on_done(body)`` (awaited) stores the final body before it is sent;
    a failure of the backend ends the stream with ``response.failed`` (``failure(exc)``: its code and message)."""
    state = _Stream()
    yield state.event("response.created", response=meta.snapshot("in_progress", []))
    yield state.event("response.in_progress", response=meta.snapshot("in_progress", []))
    try:
        async for event in _events(state, meta, events, on_done):
            yield event
    except Exception as exc:  # after the headers: the stream's own end, as OpenAI's
        code, message = failure(exc)
        body = meta.snapshot("failed", state.output)
        body["error"] = {"code": code, "message": message}
        yield state.event("response.failed", response=body)


async def _events(state: _Stream, meta: ResponseMeta, events: AsyncIterator[StreamEvent],
                  on_done) -> AsyncIterator[Event]:
    async for event in events:
        if isinstance(event, Done):
            for out in state.close():
                yield out
            status = status_of(event)
            body = meta.snapshot(status, state.output, event)
            await on_done(body)
            yield state.event(f"response.{status}", response=body)
            return
        for out in _chunk_events(state, event):
            yield out


def _chunk_events(state: _Stream, chunk: Chunk) -> list[Event]:
    events: list[Event] = []
    if chunk.thinking:
        events += state.open("reasoning", {"id": new_id("rs"), "type": "reasoning", "summary": []})
        events.append(state.delta(chunk.thinking))
    if chunk.text:
        events += state.open("message", message_item(new_id("msg"), "", "in_progress"))
        events.append(state.delta(chunk.text))
    for call in chunk.tool_calls:
        events += state.open("function_call", call_item(new_id("fc"), call, "in_progress"))
        events.append(state.delta(call.arguments))
    return events


