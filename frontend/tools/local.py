"""Tool calling for the in-process engines (llama.cpp, native): what the model sees, and its output as calls.

``@tool_calling(grammar=...)`` wraps a local backend's ``stream``; a request without tools goes straight
through (no extra layer). With tools:

- the model must support them (its template uses ``.Tools`` / ``tools``), else Ollama's 400
  ``<full model name> does not support tools`` — unless ``tool_choice`` is ``"none"``;
- ``tool_choice`` ``"none"``: tools are not rendered and nothing is parsed; ``"auto"`` (default): tools
  are rendered and the output parsed with the template's tag (:mod:`frontend.tools.parser`), text
  passing through as it streams; a named function: only that tool is rendered;
- a forced choice (``"required"`` or a named function) on an engine with grammars (llama.cpp): the
  output is constrained to JSON (vLLM's guided decoding): the named function's arguments object, or
  for ``"required"`` a list of ``{"name", "arguments"}`` of the given tools (one item at most with
  ``parallel_tool_calls: false``); the whole output becomes the calls, so a model that cannot be steered
  still answers with well-formed calls;
- a forced choice without grammars (native): tools are rendered and the output parsed; an answer
  without a call is an error (500: "tool_choice required: the model answered without a tool call"),
  not a silent text reply. The held output is not streamed before that is known.
- a forced choice whose output reached ``max_tokens`` without a complete call is a 400 naming the limit.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from registry.details import ModelDetails

from core.base import Chunk, Done, GenerationRequest, StreamEvent, TokenLogprob, ToolCall
from core.errors import BackendError, InvalidRequest
from .parser import ToolCallParser, supports_tools, tag_of
from .wire import call_id, chosen_tools, named_tool, tool_names

__all__ = ["ToolPlan", "tool_calling"]

Stream = Callable[[Any, GenerationRequest], AsyncIterator[StreamEvent]]


def tool_calling(*, grammar: bool) -> Callable[[Stream], Stream]:
    """Decorate a local backend's ``stream``; ``grammar``: the engine honours ``request.format``."""
    def wrap(stream: Stream) -> Stream:
        @functools.wraps(stream)
        def with_tools(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
            if not request.tools:
                return stream(self, request)
            return _tool_stream(stream, self, request, grammar)
        return with_tools
    return wrap


async def _tool_stream(stream: Stream, backend, request: GenerationRequest, grammar: bool):
    plan = ToolPlan.build(request, backend.details(request.model), grammar=grammar)
    async with aclosing(stream(backend, plan.request)) as events:
        async for event in plan.run(events):
            yield event


@dataclass
class ToolPlan:
    request: GenerationRequest  # what the engine generates from (tools chosen, maybe a grammar)
    mode: str  # "plain" (no tools), "parse" (tag parsing), "forced" (the output is the calls' JSON)
    tag: str = "{"
    names: tuple[str, ...] = ()
    required: bool = False  # a call must come
    named: str | None = None

    @classmethod
    def build(cls, request: GenerationRequest, details: ModelDetails, *, grammar: bool) -> ToolPlan:
        tools = chosen_tools(request.tools, request.tool_choice)
        if not tools:
            return cls(replace(request, tools=None), "plain")
        if not supports_tools(details):
            raise InvalidRequest(f"{details.name.full} does not support tools", param="tools")
        named = named_tool(request.tool_choice)
        required = named is not None or request.tool_choice == "required"
        names = tuple(tool_names(tools))
        if required and grammar:
            if request.format is not None:
                raise InvalidRequest("a forced tool_choice cannot be combined with a response format",
                                     param="tool_choice")
            schema = _call_schema(tools, named, parallel=request.parallel_tool_calls)
            return cls(replace(request, tools=tools, format=schema), "forced",
                       names=names, required=True, named=named)
        return cls(replace(request, tools=tools), "parse", tag_of(details), names, required, named)

    async def run(self, events: AsyncIterator[StreamEvent]) -> AsyncIterator[StreamEvent]:
        if self.mode == "plain":
            async for event in events:
                yield event
            return
        held = _Held()
        parser = ToolCallParser(self.tag, list(self.names))
        async for event in events:
            if isinstance(event, Done):
                async for out in self._end(event, parser, held):
                    yield out
                return
            if self.mode == "forced" or self.required:
                held.add(event)
                continue
            text, calls = parser.feed(event.text)
            if text or event.token_ids or event.logprobs or event.thinking:
                yield Chunk(text, event.token_ids, event.logprobs, thinking=event.thinking)
            if calls:
                yield Chunk("", tool_calls=calls)

    async def _end(self, done: Done, parser: ToolCallParser, held: _Held) -> AsyncIterator[StreamEvent]:
        if done.finish_reason in ("cancelled", "error"):
            yield done
            return
        if self.mode == "forced":
            calls, text = self._forced_calls(held.text, done), ""
        elif self.required:
            text, calls = parser.feed(held.text)
            more_text, more = parser.finish()
            text, calls = text + more_text, calls + more
        else:
            text, calls = parser.finish()
        if self.required and not calls:
            raise _missing_call(self.named, held.text, done)
        if text or held.token_ids or held.logprobs or held.thinking:
            yield Chunk(text, held.token_ids, held.logprobs or None, thinking=held.thinking)
        if calls:
            yield Chunk("", tool_calls=calls)
        yield done

    def _forced_calls(self, text: str, done: Done) -> list[ToolCall]:
        try:
            value = json.loads(text)
        except ValueError:
            raise _missing_call(self.named, text, done) from None
        if self.named is not None:
            return [ToolCall(self.named, json.dumps(value, ensure_ascii=False), call_id())]
        return [ToolCall(item["name"], json.dumps(item["arguments"], ensure_ascii=False), call_id())
                for item in value]


class _Held:
    """Output kept back until the end (a forced call is judged whole)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.thinking = ""  # a reasoning model's thinking, shown before the calls

    def add(self, chunk: Chunk) -> None:
        self.thinking += chunk.thinking
        self.parts.append(chunk.text)
        self.token_ids += chunk.token_ids
        self.logprobs += chunk.logprobs or []

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _call_schema(tools: list[dict], named: str | None, *, parallel: bool) -> dict[str, Any]:
    """The JSON Schema a forced answer must follow: the named function's arguments, or a non-empty list
    of calls of the given functions (one at most without ``parallel``)."""
    def parameters(tool: dict) -> dict:
        return tool["function"].get("parameters") or {"type": "object"}

    if named is not None:
        return parameters(next(t for t in tools if t["function"]["name"] == named))
    calls = [{"type": "object", "properties": {"name": {"enum": [t["function"]["name"]]},
                                               "arguments": parameters(t)},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    return schema if parallel else {**schema, "maxItems": 1}


def _missing_call(named: str | None, text: str, done: Done) -> BackendError:
    what = f"tool_choice '{named}'" if named else "tool_choice 'required'"
    if done.finish_reason == "length":
        error: BackendError = InvalidRequest(f"{what}: no complete tool call within max_tokens "
                                             f"({done.usage.output_tokens} tokens); raise max_tokens",
                                             param="max_tokens")
    else:
        error = BackendError(f"{what}: the model answered without a tool call: {text[:200]!r}")
    error.partial = done
    return error
