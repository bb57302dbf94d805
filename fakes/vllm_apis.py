"""The fake vLLM's Anthropic Messages (``/v1/messages``) and OpenAI Responses (``/v1/responses``) routes,
shaped as vLLM 0.32 answers them (``entrypoints/anthropic/``, ``entrypoints/openai/responses/``, started
with ``--enable-prompt-tokens-details``): both are translations onto the chat route's generation, as
vLLM's are. Text only: no tools, thinking or logprobs (the fake's chat has none); a mid-stream fault
cuts the connection.

Anthropic: the Message (``exclude_none``: no ``stop_sequence`` unless one matched) and its events,
``event:`` and ``data:`` lines, no ``ping``. Responses: every field of vLLM's ``ResponsesResponse``
(``null`` where it has no value, the sampling values it applied), its stream ending with
``response.completed`` whatever the status, as vLLM 0.32 does.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from starlette.requests import Request

from .behaviour import Behaviour
from .common import Reply, Wire, drive, json_reply, read_request
from .engine import FakeEngine, Generation
from .vllm import error_reply, error_type, problem

SSE = "text/event-stream; charset=utf-8"


def _error(b: Behaviour, problem: tuple[int, str, str | None], anthropic: bool) -> Reply:
    status, message, param = problem
    if not anthropic:
        return error_reply(b, status, message, param)
    return json_reply(b, {"type": "error", "error": {"type": error_type(status), "message": message}}, status)


def _checked(b: Behaviour, limit_field: str, chat: dict[str, Any]) -> tuple[int, str, str | None] | None:
    """vLLM's chat checks on the translated request, naming the limit as the route it came through does."""
    found = problem(chat, True, b)
    if found is None:
        return None
    status, message, param = found
    return status, message.replace("max_tokens", limit_field), limit_field if param == "max_tokens" else param


# -- Anthropic Messages ------------------------------------------------------------------------------

def anthropic_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request vLLM makes of a Messages request (``to_chat_completion_request``)."""
    system = body.get("system")
    if isinstance(system, list):
        system = "".join(block.get("text", "") for block in system if isinstance(block, dict))
    messages = ([{"role": "system", "content": system}] if system else []) + list(body.get("messages") or [])
    return {"model": body.get("model"), "messages": messages, "max_tokens": body.get("max_tokens"),
            "stop": body.get("stop_sequences"), "temperature": body.get("temperature")}


def anthropic_usage(gen: Generation, output: int | None = None) -> dict[str, Any]:
    return {"input_tokens": gen.prompt_tokens, "output_tokens": gen.completion_tokens if output is None else output,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def stop_reason(gen: Generation) -> tuple[str, str | None]:
    if gen.finish_reason == "length":
        return "max_tokens", None
    return ("stop_sequence", gen.stop_sequence) if gen.stop_sequence is not None else ("end_turn", None)


def message(msg_id: str, model: str, gen: Generation) -> dict[str, Any]:
    reason, sequence = stop_reason(gen)
    out = {"id": msg_id, "type": "message", "role": "assistant", "content": [{"type": "text", "text": gen.text}],
           "model": model, "stop_reason": reason, "usage": anthropic_usage(gen)}
    return {**out, "stop_sequence": sequence} if sequence is not None else out


def _event(kind: str, value: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **value})}\n\n".encode()


def anthropic_wire(msg_id: str, model: str, gen: Generation) -> Wire:
    def token(i: int) -> bytes:
        head = b""
        if i == 0:
            start = {"id": msg_id, "type": "message", "role": "assistant", "content": [], "model": model,
                     "stop_reason": None, "stop_sequence": None,
                     "usage": {"input_tokens": gen.prompt_tokens, "output_tokens": 0}}
            head = _event("message_start", {"message": start}) + _event(
                "content_block_start", {"content_block": {"type": "text", "text": ""}, "index": 0})
        return head + _event("content_block_delta", {"delta": {"type": "text_delta", "text": gen.tokens[i][1]},
                                                     "index": 0})

    def finish() -> bytes:
        reason, sequence = stop_reason(gen)
        return (_event("content_block_stop", {"index": 0})
                + _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                           "usage": anthropic_usage(gen)})
                + _event("message_stop", {}))

    return Wire(token, finish, None, b"event: message_start\ndata: {\n\n", tail=b"")


async def messages(b: Behaviour, request: Request) -> Reply:
    body = await read_request(request, b)
    if not isinstance(body, dict):
        return _error(b, (400, "JSON decode error: the request body is not a JSON object", None), True)
    chat = anthropic_chat(body)
    found = _checked(b, "max_completion_tokens", chat)
    if found:
        return _error(b, found, True)
    gen = FakeEngine.run(chat["messages"], chat["max_tokens"], chat["stop"])
    msg_id, model = f"chatcmpl-{uuid.uuid4().hex[:16]}", body.get("model") or b.models[0]
    if not body.get("stream"):
        return json_reply(b, message(msg_id, model, gen))
    return Reply(b, 200, {"content-type": SSE}, drive(b, len(gen.tokens), anthropic_wire(msg_id, model, gen)))


# -- OpenAI Responses --------------------------------------------------------------------------------

def responses_chat(body: dict[str, Any]) -> dict[str, Any]:
    value = body.get("input")
    items = [{"role": "user", "content": value}] if isinstance(value, str) else list(value or [])
    messages = [{"role": item.get("role", "user"), "content": _text(item.get("content"))} for item in items]
    system = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    return {"model": body.get("model"), "messages": system + messages, "max_tokens": body.get("max_output_tokens"),
            "temperature": body.get("temperature")}


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content or "")


def response_body(body: dict[str, Any], resp_id: str, model: str, output: list, status: str,
                  gen: Generation | None) -> dict[str, Any]:
    """vLLM's ``ResponsesResponse``: its every field, ``null`` where it has no value."""
    cut = gen is not None and gen.finish_reason == "length"
    usage = None if gen is None else {
        "input_tokens": gen.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0, "input_tokens_per_turn": [],
                                 "cached_tokens_per_turn": []},
        "output_tokens": gen.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [],
                                  "tool_output_tokens_per_turn": []},
        "total_tokens": gen.prompt_tokens + gen.completion_tokens}
    return {"id": resp_id, "created_at": int(time.time()),
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "instructions": body.get("instructions"), "metadata": body.get("metadata"), "model": model,
            "object": "response", "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": float(body.get("temperature", 1.0)), "tool_choice": "none", "tools": [],
            "top_p": float(body.get("top_p", 1.0)), "background": False,
            "max_output_tokens": body.get("max_output_tokens"), "max_tool_calls": None,
            "previous_response_id": None, "prompt": None, "reasoning": None, "service_tier": "auto",
            "status": "incomplete" if cut else status, "text": None, "top_logprobs": None,
            "truncation": "disabled", "usage": usage, "user": body.get("user"), "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "kv_transfer_params": None, "ec_transfer_params": None,
            "input_messages": None, "output_messages": None}


def message_item(item_id: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [{"annotations": [], "text": text, "type": "output_text", "logprobs": None}]
    return {"id": item_id, "content": content, "role": "assistant",
            "status": "in_progress" if text is None else "completed", "type": "message", "phase": None}


def responses_wire(body: dict[str, Any], resp_id: str, model: str, gen: Generation) -> Wire:
    item_id = f"msg_{uuid.uuid4().hex[:16]}"
    sequence = iter(range(1 << 30))

    def event(kind: str, **fields: Any) -> bytes:
        value = {**fields, "sequence_number": next(sequence), "type": kind}
        return f"event: {kind}\ndata: {json.dumps(value)}\n\n".encode()

    at = {"item_id": item_id, "output_index": 0}

    def opening() -> bytes:
        started = response_body(body, resp_id, model, [], "in_progress", None)
        return (event("response.created", response=started) + event("response.in_progress", response=started)
                + event("response.output_item.added", item=message_item(item_id, None), output_index=0)
                + event("response.content_part.added", content_index=0, **at,
                        part={"annotations": [], "text": "", "type": "output_text", "logprobs": []}))

    def token(i: int) -> bytes:
        head = opening() if i == 0 else b""
        return head + event("response.output_text.delta", content_index=0, delta=gen.tokens[i][1], **at, logprobs=[])

    def finish() -> bytes:
        done = message_item(item_id, gen.text)
        final = response_body(body, resp_id, model, [done], "completed", gen)
        return ((opening() if not gen.tokens else b"")
                + event("response.output_text.done", content_index=0, **at, logprobs=[], text=gen.text)
                + event("response.content_part.done", content_index=0, **at, part=done["content"][0])
                + event("response.output_item.done", item=done, output_index=0)
                + event("response.completed", response=final))

    return Wire(token, finish, None, b"event: response.created\ndata: {\n\n", tail=b"")


async def responses(b: Behaviour, request: Request) -> Reply:
    body = await read_request(request, b)
    if not isinstance(body, dict) or "input" not in body:
        return _error(b, (400, "Field required: input", "input"), False)
    chat = responses_chat(body)
    found = _checked(b, "max_output_tokens", chat)
    if found:
        return _error(b, found, False)
    gen = FakeEngine.run(chat["messages"], chat["max_tokens"], None)
    resp_id, model = f"resp_{uuid.uuid4().hex[:16]}", body.get("model") or b.models[0]
    if not body.get("stream"):
        output = [message_item(f"msg_{uuid.uuid4().hex[:16]}", gen.text)]
        return json_reply(b, response_body(body, resp_id, model, output, "completed", gen))
    return Reply(b, 200, {"content-type": SSE}, drive(b, len(gen.tokens), responses_wire(body, resp_id, model, gen)))
