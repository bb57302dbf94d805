"""Tool calling on the wire: the one internal shape, and its OpenAI and Ollama forms.

Inside the gateway a request's ``tools`` are OpenAI/Ollama function tools (both APIs use
``{"type": "function", "function": {"name", "description", "parameters"}}``), and its messages carry
tool calls in one shape, the one chat templates read (HF Jinja ``tool_call.function.arguments``, Ollama
Go ``.ToolCalls``/``.Function.Arguments``)::

    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_…", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    {"role": "tool", "content": "18 °C", "tool_call_id": "call_…", "tool_name": "get_weather"}

Arguments are an object inside (Ollama's wire form and what templates print); OpenAI's wire carries
them as JSON text. A generated call is an :class:`core.base.ToolCall` (arguments as JSON text).

``tool_choice`` (OpenAI's): None or ``"auto"``, ``"none"``, ``"required"``, or
``{"type": "function", "function": {"name": …}}``; :func:`check_tools` refuses what OpenAI refuses.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from core.base import ToolCall
from core.errors import BackendProtocolError, InvalidRequest

__all__ = ["arguments_object", "call_id", "check_tools", "chosen_tools", "from_wire_call", "internal_calls",
           "name_tool_results", "named_tool", "ollama_call", "ollama_messages", "openai_call", "openai_messages",
           "parse_arguments", "tool_names"]

NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")
CHOICES = ("auto", "none", "required")


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


# -- request checks --------------------------------------------------------------------------------

def check_tools(tools: list[Any] | None, tool_choice: str | dict | None) -> None:
    """InvalidRequest (400) for a malformed tool list or a ``tool_choice`` that cannot be honoured."""
    for i, tool in enumerate(tools or []):
        _check_tool(i, tool)
    if tool_choice is None or tool_choice in ("auto", "none"):
        return
    if not tools:
        raise InvalidRequest("'tool_choice' is only allowed when 'tools' are specified", param="tool_choice")
    if tool_choice == "required":
        return
    name = named_tool(tool_choice)
    if name is None:
        raise InvalidRequest("'tool_choice' must be \"auto\", \"none\", \"required\" or "
                             "{\"type\": \"function\", \"function\": {\"name\": …}}", param="tool_choice")
    if name not in tool_names(tools):
        raise InvalidRequest(f"'tool_choice' names function '{name}', which is not in 'tools'", param="tool_choice")


def _check_tool(i: int, tool: Any) -> None:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise InvalidRequest(f"{where}: only tools of type 'function' are supported", param=where)
    function = tool.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidRequest(f"{where}.function.name is required", param=f"{where}.function")
    if not NAME.match(function["name"]):
        raise InvalidRequest(f"{where}.function.name must be 1-64 letters, digits, '_', '.' or '-', "
                             f"got {function['name']!r}", param=f"{where}.function.name")
    parameters = function.get("parameters")
    if parameters is None:
        return
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise InvalidRequest(f"{where}.function.parameters must be a JSON Schema of type 'object'",
                             param=f"{where}.function.parameters")
    problem = _schema_problem(json.dumps(parameters, sort_keys=True))
    if problem is not None:
        raise InvalidRequest(f"{where}.function.parameters is not a valid JSON Schema: {problem}",
                             param=f"{where}.function.parameters")


@functools.lru_cache(maxsize=4096)
def _schema_problem(schema: str) -> str | None:
    """Why a JSON Schema (as sorted JSON text) is invalid, or None; about a millisecond a schema, so an agent's
    tools, sent again with every request, are checked once."""
    try:
        Draft202012Validator.check_schema(json.loads(schema))
    except SchemaError as exc:
        return exc.message
    return None


def tool_names(tools: list[dict] | None) -> list[str]:
    return [t["function"]["name"] for t in tools or [] if isinstance(t.get("function"), dict)]


def named_tool(tool_choice: str | dict | None) -> str | None:
    """The function ``tool_choice`` forces, if it names one."""
    if not isinstance(tool_choice, dict):
        return None
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) and tool_choice.get("type", "function") == "function" else None


def chosen_tools(tools: list[dict] | None, tool_choice: str | dict | None) -> list[dict] | None:
    """The tools a model should see: none for ``"none"``, only the named one for a named choice."""
    if not tools or tool_choice == "none":
        return None
    name = named_tool(tool_choice)
    return [t for t in tools if t["function"]["name"] == name] if name else tools


# -- arguments ---------------------------------------------------------------------------------------

def parse_arguments(text: Any, where: str = "arguments") -> dict[str, Any]:
    """Arguments as an object, from JSON text or an object; InvalidRequest when they are neither."""
    if isinstance(text, dict):
        return text
    if isinstance(text, str):
        try:
            value = json.loads(text) if text.strip() else {}
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value
    raise InvalidRequest(f"{where} must be a JSON object, got {str(text)[:200]!r}", param=where)


def arguments_object(call: ToolCall) -> dict[str, Any]:
    """A generated call's arguments as an object (Ollama's wire); a backend that sent something else
    broke the protocol."""
    try:
        return parse_arguments(call.arguments)
    except InvalidRequest:
        raise BackendProtocolError(f"the model's call of '{call.name}' has arguments that are not a JSON "
                                   f"object: {call.arguments[:200]!r}") from None


# -- generated calls on each API's wire ---------------------------------------------------------------

def openai_call(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": call.id or call_id(), "type": "function",
                           "function": {"name": call.name, "arguments": call.arguments}}
    return out if index is None else {"index": index, **out}


def ollama_call(call: ToolCall, index: int) -> dict[str, Any]:
    return {"id": call.id or call_id(),
            "function": {"index": index, "name": call.name, "arguments": arguments_object(call)}}


def from_wire_call(call: dict[str, Any]) -> ToolCall:
    """A call in a backend's reply, OpenAI (arguments text) or Ollama (arguments object) shaped."""
    function = call.get("function") or {}
    arguments = function.get("arguments")
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {}, ensure_ascii=False)
    return ToolCall(name=str(function.get("name") or ""), arguments=text, id=str(call.get("id") or "") or call_id())


# -- history messages on a backend's wire -----------------------------------------------------------

def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Internal messages as an OpenAI-compatible server reads them (arguments as JSON text)."""
    return [_openai_message(m) for m in messages]


def _openai_message(message: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in message.items() if k in ("role", "content", "tool_call_id", "name")}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [{"id": c.get("id") or call_id(), "type": "function",
                              "function": {"name": c["function"]["name"],
                                           "arguments": json.dumps(c["function"].get("arguments") or {},
                                                                   ensure_ascii=False)}}
                             for c in calls]
        out["content"] = message.get("content") or None
    return out


def ollama_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Internal messages as Ollama's ``/api/chat`` reads them (no ``type``; ``tool_name`` on results)."""
    out = []
    for message in messages:
        item = {k: v for k, v in message.items() if k != "tool_calls"}
        if message.get("tool_calls"):
            item["tool_calls"] = [{**({"id": c["id"]} if c.get("id") else {}),
                                   "function": {"name": c["function"]["name"],
                                                "arguments": c["function"].get("arguments") or {}}}
                                  for c in message["tool_calls"]]
        out.append(item)
    return out


def internal_calls(calls: list[Any], where: str) -> list[dict[str, Any]]:
    """A history message's ``tool_calls`` (OpenAI or Ollama shaped) in the internal shape."""
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"{where}[{i}].function.name is required", param=where)
        arguments = parse_arguments(function.get("arguments"), f"{where}[{i}].function.arguments")
        out.append({"id": str(call.get("id") or call_id()), "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    return out


def name_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``tool_name`` on each tool result, from the call its ``tool_call_id`` answers (Ollama does this
    for OpenAI clients, whose tool messages carry only the id)."""
    names: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            names[call["id"]] = call["function"]["name"]
        if message.get("role") == "tool" and not message.get("tool_name") and message.get("tool_call_id") in names:
            message["tool_name"] = names[message["tool_call_id"]]
    return messages
