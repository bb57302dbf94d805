"""OpenAI's Responses API request (``POST /v1/responses``) and its one translation onto
:class:`core.base.GenerationRequest`.

- ``input``: a string (one user message) or items: messages (``role`` user/assistant/system/developer,
  ``content`` a string or ``input_text``/``output_text`` parts), ``function_call`` items (they join the
  assistant message before them, or make one), ``function_call_output`` items (tool messages) and
  ``reasoning`` items (dropped: the model sees its own past thinking no more than chat templates show it);
- ``instructions``: the system message of this request only (not carried to the next turn, as OpenAI);
- ``previous_response_id``: the stored conversation that response ended (``ledger/responses.py``) comes
  first; unknown or expired is a 404;
- ``tools``: function tools (``{"type": "function", "name", "parameters"}``); hosted tools (web search,
  file search, shell, custom) are skipped: nothing here runs them; ``tool_choice`` and ``parallel_tool_calls``
  as on chat;
- ``max_output_tokens`` → ``num_predict`` (clamped to the context), ``temperature``/``top_p``,
  ``reasoning.effort`` → ``think`` (``"none"`` → false), ``text.format`` → the response format.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from core.base import GenerationRequest
from frontend.tools.wire import check_tools, internal_calls, name_tool_results

from gateway.http.errors import APIError
from gateway.openai.schemas import _Request, think_of_effort

HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation",
                "computer_use_preview", "local_shell", "shell", "mcp", "custom", "apply_patch")


class Reasoning(_Request):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(_Request):
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool | None = True
    stream: bool | None = False
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: Reasoning | None = None
    text: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    engine: str | None = None  # ours: which in-process engine serves the request (llamacpp, native)

    @field_validator("input")
    @classmethod
    def _input(cls, value: str | list) -> str | list:
        if isinstance(value, list) and not value:
            raise ValueError("must not be empty")
        return value

    def function_tools(self) -> list[dict[str, Any]] | None:
        tools = []
        for i, tool in enumerate(self.tools or []):
            kind = tool.get("type")
            if kind in HOSTED_TOOLS:
                continue
            if kind != "function" or not isinstance(tool.get("name"), str):
                raise APIError(400, f"tools[{i}]: expected a function tool {{\"type\": \"function\", \"name\", "
                                    f"\"parameters\"}}, got type {kind!r}", param=f"tools[{i}]")
            function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
            tools.append({"type": "function", "function": function})
        return tools or None

    def choice(self, tools: list[dict] | None) -> str | dict | None:
        choice = self.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
            choice = {"type": "function", "function": {"name": choice.get("name")}}
        if choice is not None and not tools and choice in ("auto", "none"):
            return None
        check_tools(tools, choice)
        return choice

    def generation_request(self, history: list[dict[str, Any]], client: str | None) -> GenerationRequest:
        """The request for ``history`` (a stored conversation) followed by this request's input."""
        tools = self.function_tools()
        choice = self.choice(tools)
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages = name_tool_results([*system, *history, *input_messages(self.input)])
        values = {"num_predict": self.max_output_tokens, "temperature": self.temperature, "top_p": self.top_p}
        return GenerationRequest(model=self.model, engine=self.engine, messages=messages, tools=tools,
                                 tool_choice=choice, parallel_tool_calls=self.parallel_tool_calls is not False,
                                 options={k: v for k, v in values.items() if v is not None},
                                 think=think_of_effort(self.reasoning.effort if self.reasoning else None),
                                 format=_format(self.text), client=client)


def input_messages(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input`` in the internal message shape (``frontend/tools/wire.py``)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        _item(out, i, item)
    return out


def _item(out: list[dict[str, Any]], i: int, item: dict[str, Any]) -> None:
    kind = item.get("type", "message")
    where = f"input[{i}]"
    if kind == "message" and "role" in item:
        role = {"developer": "system"}.get(item["role"], item["role"])
        if role not in ("user", "assistant", "system"):
            raise APIError(400, f"{where}.role must be user, assistant, system or developer", param=f"{where}.role")
        out.append({"role": role, "content": _content(item.get("content"), where)})
    elif kind == "function_call":
        call = internal_calls([{"id": item.get("call_id"), "function": {"name": item.get("name"),
                                                                         "arguments": item.get("arguments")}}], where)
        last = out[-1] if out else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).extend(call)
        else:
            out.append({"role": "assistant", "content": "", "tool_calls": call})
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise APIError(400, f"{where}.call_id is required", param=f"{where}.call_id")
        out.append({"role": "tool", "content": _content(item.get("output"), where), "tool_call_id": item["call_id"]})
    elif kind != "reasoning":
        raise APIError(400, f"{where}: input items of type {kind!r} are not supported", param=where)


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{where}.content must be a string or a list of content parts", param=where)
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "refusal", "summary_text"):
            texts.append(str(part.get("text") or part.get("refusal") or ""))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise APIError(400, f"{where}: {kind} parts are not supported by this server", param=where)
        else:
            raise APIError(400, f"{where}: unsupported content part {kind!r}", param=where)
    return "\n".join(texts)


def _format(text: dict[str, Any] | None) -> str | dict | None:
    fmt = (text or {}).get("format") or {}
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema" and isinstance(fmt.get("schema"), dict):
        return fmt["schema"]
    raise APIError(400, "text.format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                        "{\"type\": \"json_schema\", \"schema\": {...}}", param="text.format")
