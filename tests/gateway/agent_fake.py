"""A loopback fake of a reasoning, tool-calling vLLM (OpenAI wire) for the agent APIs' remote tests.

Every chat answer thinks first (``reasoning_content``, as vLLM's reasoning parsers send it), then:

- with ``tools`` and a conversation whose last message is not a tool result: one ``get_weather`` call
  (``{"city": "Paris"}``), streamed as vLLM streams calls (name first, then the arguments in pieces);
- otherwise the text ``It is 18 °C in Paris.`` in three pieces.

Usage reports ``completion_tokens_details.reasoning_tokens`` (``REASONING_TOKENS``). Bodies received are kept.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

THOUGHT = ["The user asks", " about the weather."]
ANSWER = ["It is ", "18 °C ", "in Paris."]
CALL_ID = "call_agent0001"
ARGUMENTS = '{"city": "Paris"}'
PROMPT_TOKENS, REASONING_TOKENS, TEXT_TOKENS = 40, 6, 7


def agent_app(received: list[dict[str, Any]]) -> Starlette:
    async def chat(request: Request):
        body = await request.json()
        received.append(body)
        calls = bool(body.get("tools")) and (body.get("messages") or [{}])[-1].get("role") != "tool"
        if body.get("stream"):
            return StreamingResponse(_events(body["model"], calls), media_type="text/event-stream")
        message: dict[str, Any] = {"role": "assistant", "reasoning_content": "".join(THOUGHT)}
        if calls:
            message.update(content=None, tool_calls=[{"id": CALL_ID, "type": "function",
                                                      "function": {"name": "get_weather", "arguments": ARGUMENTS}}])
        else:
            message["content"] = "".join(ANSWER)
        return JSONResponse({"id": "chatcmpl-agent", "object": "chat.completion", "created": 1, "model": body["model"],
                             "choices": [{"index": 0, "message": message,
                                          "finish_reason": "tool_calls" if calls else "stop"}],
                             "usage": _usage(calls)})

    async def models(_: Request):
        return JSONResponse({"object": "list", "data": [{"id": "agent", "object": "model"}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models),
                             Route("/health", lambda _: PlainTextResponse(""))])


def _usage(calls: bool) -> dict[str, Any]:
    completion = REASONING_TOKENS + (9 if calls else TEXT_TOKENS)
    return {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": completion,
            "total_tokens": PROMPT_TOKENS + completion,
            "completion_tokens_details": {"reasoning_tokens": REASONING_TOKENS}}


async def _events(model: str, calls: bool):
    head = {"id": "chatcmpl-agent", "object": "chat.completion.chunk", "created": 1, "model": model}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"reasoning_content": piece} for piece in THOUGHT]
    if calls:
        first = {"index": 0, "id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": ""}}
        deltas += [{"tool_calls": [first]}, {"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS[:8]}}]},
                   {"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS[8:]}}]}]
    else:
        deltas += [{"content": piece} for piece in ANSWER]
    for delta in deltas:
        yield _event({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    reason = "tool_calls" if calls else "stop"
    yield _event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
    yield _event({**head, "choices": [], "usage": _usage(calls)})
    yield b"data: [DONE]\n\n"


def _event(value: dict) -> bytes:
    return f"data: {json.dumps(value)}\n\n".encode()
