"""Anthropic Messages API request bodies (``POST /v1/messages``, ``/v1/messages/count_tokens``) and their
one translation onto :class:`core.base.GenerationRequest`.

Field names mirror Anthropic's wire. Unknown fields are ignored (Claude Code sends ``cache_control``,
``context_management``, beta fields); a known field of the wrong type is a 400 in Anthropic's error shape.

The translation, once, here:

- ``system`` (a string or text blocks) becomes one system message; Claude Code's per-request
  ``x-anthropic-billing-header`` block is dropped (it changes every request and would defeat prefix caching);
- a user turn's ``tool_result`` blocks become ``tool`` messages (first, in order: they answer the calls of
  the turn before), its text blocks one user message; an assistant turn's ``tool_use`` blocks become its
  ``tool_calls`` (the internal shape of ``frontend/tools/wire.py``), its ``thinking`` blocks its ``thinking``;
- ``tools`` (``input_schema``) become function tools; ``tool_choice`` ``auto``/``any``/``tool``/``none``
  become ``auto``/``required``/a named function/``none``, ``disable_parallel_tool_use`` one call at most;
- ``max_tokens`` → ``num_predict`` (clamped to the model's context, not refused: agents ask for 32k),
  ``stop_sequences`` → ``stop``, ``temperature``/``top_p``/``top_k`` as they are;
- ``thinking: {"type": "enabled"}`` → ``think: true``, ``"disabled"`` → false (``budget_tokens`` is not
  enforced: ``max_tokens`` bounds thinking and answer together).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.base import GenerationRequest
from frontend.tools.wire import check_tools, name_tool_results
from gateway.http.bodies import checked_text
from gateway.http.errors import APIError

BILLING_HEADER = "x-anthropic-billing-header"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class MessageParam(_Wire):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class ToolChoice(_Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Wire):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)


class _Body(_Wire):
    _text = model_validator(mode="before")(classmethod(checked_text))

    model: str = Field(min_length=1)
    messages: list[MessageParam]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    engine: str | None = None  # ours: which in-process engine serves the request (llamacpp, native)

    def translated(self, client: str | None) -> GenerationRequest:
        tools = [_tool(i, t) for i, t in enumerate(self.tools or [])] or None
        choice, parallel = _tool_choice(self.tool_choice)
        check_tools(tools, choice if tools else None)
        messages = _system(self.system) + [m for i, msg in enumerate(self.messages) for m in _messages(i, msg)]
        think = None if self.thinking is None or self.thinking.type == "adaptive" else self.thinking.type == "enabled"
        return GenerationRequest(model=self.model, engine=self.engine, messages=name_tool_results(messages),
                                 tools=tools, tool_choice=choice if tools else None, parallel_tool_calls=parallel,
                                 think=think, client=client)


class MessagesRequest(_Body):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    metadata: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, value: list[MessageParam]) -> list[MessageParam]:
        if not value:
            raise ValueError("at least one message is required")
        return value

    def generation_request(self, client: str | None) -> GenerationRequest:
        request = self.translated(client)
        values = {"num_predict": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                  "top_k": self.top_k, "stop": self.stop_sequences or None}
        request.options = {k: v for k, v in values.items() if v is not None}
        request.stream = request.early_usage = bool(self.stream)  # message_start carries the prompt's size
        return request


class CountTokensRequest(_Body):
    """``POST /v1/messages/count_tokens``: the prompt without generation fields."""


# -- the pieces --------------------------------------------------------------------------------------

def _system(system: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    texts = [_text_of(block, "system") for block in system]
    kept = [t for t in texts if not t.startswith(BILLING_HEADER)]
    return [{"role": "system", "content": "\n\n".join(kept)}] if kept else []


def _messages(index: int, message: MessageParam) -> list[dict[str, Any]]:
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    where = f"messages.{index}.content"
    if message.role == "user":
        return _user_turn(message.content, where)
    return [_assistant_turn(message.content, where)]


def _user_turn(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    results, texts = [], []
    for i, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "tool_result":
            results.append(_tool_result(block, f"{where}.{i}"))
        elif kind == "text":
            texts.append(_text_of(block, f"{where}.{i}"))
        else:
            _unsupported(kind, f"{where}.{i}")
    return results + ([{"role": "user", "content": "\n\n".join(texts)}] if texts else [])


def _assistant_turn(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts, calls, thinking = [], [], []
    for i, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            texts.append(_text_of(block, f"{where}.{i}"))
        elif kind == "tool_use":
            calls.append(_tool_use(block, f"{where}.{i}"))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking") or ""))
        elif kind != "redacted_thinking":  # opaque: nothing a local model could read
            _unsupported(kind, f"{where}.{i}")
    out: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts)}
    if calls:
        out["tool_calls"] = calls
    if thinking:
        out["thinking"] = "".join(thinking)
    return out


def _text_of(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise APIError(400, f"{where}: expected a text block {{\"type\": \"text\", \"text\": ...}}", param=where)
    return block["text"]


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    name, arguments = block.get("name"), block.get("input", {})
    if not isinstance(name, str) or not isinstance(block.get("id"), str) or not isinstance(arguments, dict):
        raise APIError(400, f"{where}: a tool_use block needs 'id', 'name' and an 'input' object", param=where)
    return {"id": block["id"], "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise APIError(400, f"{where}: a tool_result block needs 'tool_use_id'", param=where)
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n\n".join(_text_of(part, f"{where}.content") for part in content)
    else:
        raise APIError(400, f"{where}.content must be a string or text blocks", param=where)
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "content": text, "tool_call_id": block["tool_use_id"]}


def _unsupported(kind: Any, where: str) -> None:
    if kind in ("image", "document"):
        raise APIError(400, f"{where}: {kind} blocks are not supported by this server", param=where)
    raise APIError(400, f"{where}: unsupported content block type {kind!r}", param=where)


def _tool(index: int, tool: dict[str, Any]) -> dict[str, Any]:
    where = f"tools.{index}"
    if tool.get("type") not in (None, "custom"):
        raise APIError(400, f"{where}: server tools ({tool.get('type')}) are not supported; "
                            "define client tools with name, description and input_schema", param=where)
    if not isinstance(tool.get("name"), str):
        raise APIError(400, f"{where}.name is required", param=where)
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: ToolChoice | None) -> tuple[str | dict | None, bool]:
    if choice is None:
        return None, True
    parallel = not choice.disable_parallel_tool_use
    if choice.type == "tool":
        if not choice.name:
            raise APIError(400, "tool_choice of type 'tool' needs 'name'", param="tool_choice")
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel
