"""Loopback fakes of a tool-calling vLLM (OpenAI wire) and Ollama server: they answer every chat with a
``get_weather(city="Paris")`` call, streamed the way each server streams it, and keep the bodies they got.

- OpenAI/vLLM stream: a role chunk, the call's first delta (index, id, type, name, empty arguments), the
  arguments in two pieces, a chunk with ``finish_reason: "tool_calls"``, the usage chunk, ``[DONE]``.
- Ollama stream: one line whose ``message.tool_calls`` holds the whole call (arguments an object), then
  the ``done: true`` line.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

CALL_ID = "call_fake0001"
ARGUMENTS = '{"city": "Paris"}'


def openai_app(received: list[dict[str, Any]]) -> Starlette:
    async def chat(request: Request):
        body = await request.json()
        received.append(body)
        if body.get("stream"):
            return StreamingResponse(_openai_events(body["model"]), media_type="text/event-stream")
        call = {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}
        return JSONResponse({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body["model"],
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": None,
                                                                  "tool_calls": [call]},
                                          "finish_reason": "tool_calls"}],
                             "usage": {"prompt_tokens": 11, "completion_tokens": 9, "total_tokens": 20}})

    async def models(_: Request):
        return JSONResponse({"object": "list", "data": [{"id": "qwen2.5", "object": "model"}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models),
                             Route("/health", lambda _: PlainTextResponse(""))])


async def _openai_events(model: str):
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model}
    first = {"index": 0, "id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    deltas = [{"role": "assistant", "content": None}, {"tool_calls": [first]},
              {"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS[:9]}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS[9:]}}]}]
    for delta in deltas:
        yield _event({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    yield _event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    yield _event({**head, "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 9, "total_tokens": 20}})
    yield b"data: [DONE]\n\n"


def _event(value: dict) -> bytes:
    return f"data: {json.dumps(value)}\n\n".encode()


def ollama_app(received: list[dict[str, Any]]) -> Starlette:
    async def chat(request: Request):
        body = await request.json()
        received.append(body)
        message = {"role": "assistant", "content": "",
                   "tool_calls": [{"function": {"name": "get_weather", "arguments": json.loads(ARGUMENTS)}}]}
        final = {"model": body["model"], "created_at": "2026-01-01T00:00:00Z", "done": True, "done_reason": "stop",
                 "prompt_eval_count": 11, "eval_count": 9, "prompt_eval_duration": 1000, "eval_duration": 2000}
        if body.get("stream") is False:
            return JSONResponse({**final, "message": message})
        lines = [{"model": body["model"], "created_at": "2026-01-01T00:00:00Z", "message": message, "done": False},
                 {**final, "message": {"role": "assistant", "content": ""}}]
        return StreamingResponse((json.dumps(line) + "\n" for line in lines), media_type="application/x-ndjson")

    async def tags(_: Request):
        return JSONResponse({"models": [{"name": "llama3.1:latest", "model": "llama3.1:latest"}]})

    return Starlette(routes=[Route("/api/chat", chat, methods=["POST"]), Route("/api/tags", tags),
                             Route("/", lambda _: PlainTextResponse("Ollama is running"))])
