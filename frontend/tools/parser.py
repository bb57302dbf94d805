"""Tool calls in an in-process model's output, in the format its chat template teaches.

What Ollama does (its ``tools`` package): a template supports tools when it uses ``.Tools`` (Jinja:
``tools``); the tool-call *tag* is the first text inside the template's ``{{ if .ToolCalls }}`` branch,
cut before any ``{`` — ``<tool_call>`` for Qwen2/Hermes templates; none for Llama 3.x, whose calls are
bare JSON (the tag is then ``{``). Jinja templates are read by their literal markers.

:class:`ToolCallParser` is fed the generated text piece by piece and returns the text safe to show and
the calls completed so far:

- with a tag such as ``<tool_call>``: text before the tag passes through, a suffix that may be the
  start of the tag is held back; after the tag, JSON objects ``{"name", "arguments"|"parameters"}``
  (several, or a list of them; closing tags, ``;`` and ``,`` between them) become calls;
- with ``{`` (JSON calls): only output whose first non-blank text is ``{`` or ``[`` (after an optional
  ``<|python_tag|>``) is a call candidate, as in Ollama; anything else passes through unchanged;
- a candidate that turns out not to be a call (bad JSON, a name not in ``tools``) is given back as text.

    parser = ToolCallParser(tag_of(details), names=["get_weather"])
    text, calls = parser.feed(piece)   # repeatedly
    text, calls = parser.finish()      # at the end of generation
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from registry.details import ModelDetails
from registry.gotemplate_parse import Action, Branch, Text, identifiers, parse
from registry.templates import FUNCS, GoTemplate

from core.base import ToolCall
from .wire import call_id

__all__ = ["ToolCallParser", "parse_calls", "supports_tools", "tag_of", "template_tag"]

JSON_TAG = "{"
PYTHON_TAG = "<|python_tag|>"
_JINJA_TAGS = ("<tool_call>", "[TOOL_CALLS]", "<|tool_call|>", "<function_call>")
_SEPARATORS = " \t\r\n;,"


def supports_tools(details: ModelDetails) -> bool:
    """Whether the model's template renders tools (Ollama's ``tools`` capability)."""
    if details.template:
        return _go_uses_tools(details.template)
    return bool(re.search(r"\btools\b", details.chat_template or ""))


def tag_of(details: ModelDetails) -> str:
    """The tool-call tag of the model's template."""
    if details.template:
        return template_tag(details.template)
    jinja = details.chat_template or ""
    return next((tag for tag in _JINJA_TAGS if tag in jinja), JSON_TAG)


@lru_cache(maxsize=64)
def _go_uses_tools(source: str) -> bool:
    return GoTemplate(source).uses("Tools")


@lru_cache(maxsize=64)
def template_tag(source: str) -> str:
    """The first text inside a Go template's ``if .ToolCalls`` branch, up to any ``{``; ``{`` if none."""
    branch = _tool_calls_branch(parse(source, frozenset(FUNCS)))
    text = _first_text(branch.body) if branch is not None else None
    tag = (text or "").strip().replace("\r\n", "\n").split("{")[0].strip()
    return tag or JSON_TAG


def _tool_calls_branch(nodes: list) -> Branch | None:
    """The first ``if``/``with`` branch whose condition uses ``.ToolCalls`` (searched depth-first)."""
    for node in nodes:
        if not isinstance(node, Branch):
            continue
        condition = Branch(node.kind, node.pipe, [], None, node.pos)
        if node.kind in ("if", "with") and "ToolCalls" in identifiers([condition]):
            return node
        found = _tool_calls_branch(node.body) or _tool_calls_branch(node.else_body or [])
        if found is not None:
            return found
    return None


def _first_text(nodes: list) -> str | None:
    """Depth-first, stopping at the first action (text after a printed value is not a prefix)."""
    for node in nodes:
        if isinstance(node, Text):
            if node.text.strip():
                return node.text
            continue
        if isinstance(node, Action):
            return None
        if isinstance(node, Branch):
            return _first_text(node.body)
    return None


class ToolCallParser:
    def __init__(self, tag: str, names: list[str]):
        self.tag, self.names = tag, set(names)
        self.calls: list[ToolCall] = []
        self._buffer = ""
        self._lead = ""  # JSON calls: the blank text (and python tag) before them, given back on a false start
        self._state = "text"  # "text": looking for the start; "calls": buffer holds calls; "plain": no calls

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        if self._state == "plain":
            return text, []
        self._buffer += text
        out = ""
        if self._state == "text":
            out = self._look_for_start()
            if self._state != "calls":
                return out, []
        calls = self._take(final=False)
        if self._state == "plain":  # not calls after all: what was held is text
            out, self._buffer = out + self._buffer, ""
        return out, calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """End of output: the calls still complete in the buffer; a leftover after calls is text unless
        it is only closing tags and separators; a false start is given back as text."""
        if self._state != "calls":
            out, self._buffer = self._buffer, ""
            return out, []
        calls = self._take(final=True)
        rest, self._buffer = self._buffer, ""
        if self._state == "plain":
            return rest, calls
        leftover = rest
        for marker in (*self._closings(), self._tag_text(), PYTHON_TAG):
            if marker:
                leftover = leftover.replace(marker, "")
        if not leftover.strip(_SEPARATORS):
            return "", calls
        return (rest if self.calls else self._tag_text() + rest), calls

    # -- finding the start -----------------------------------------------------------------------

    def _look_for_start(self) -> str:
        """Move to "calls" (buffer = the calls' text) or "plain"; return the text that can be shown."""
        if self.tag == JSON_TAG:
            return self._json_start()
        at = self._buffer.find(self.tag)
        if at >= 0:
            out, self._buffer, self._state = self._buffer[:at], self._buffer[at + len(self.tag):], "calls"
            return out
        keep = _overlap(self._buffer, self.tag)
        cut = len(self._buffer) - keep
        out, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return out

    def _json_start(self) -> str:
        head = self._buffer.lstrip()
        if head.startswith(PYTHON_TAG):
            head = head[len(PYTHON_TAG):].lstrip()
        elif head and PYTHON_TAG.startswith(head):
            return ""  # maybe the python tag: wait
        if not head:
            return ""
        if head[0] in "{[":
            self._lead = self._buffer[:len(self._buffer) - len(head)]
            self._buffer, self._state = head, "calls"
            return ""
        out, self._buffer, self._state = self._buffer, "", "plain"
        return out

    # -- calls ---------------------------------------------------------------------------------------

    def _take(self, *, final: bool) -> list[ToolCall]:
        """Complete calls off the front of the buffer; a value that is not a call makes the rest text."""
        found: list[ToolCall] = []
        while True:
            start = self._skip(self._buffer)
            end = _json_end(self._buffer, start)
            if end < 0:
                if final and not self.calls and not found and self._buffer[start:].strip():
                    self._give_back()
                break
            calls = parse_calls(self._buffer[start:end], self.names)
            if calls is None:
                self._give_back()
                break
            found += calls
            self._buffer = self._buffer[end:]
        self.calls += found
        return found

    def _give_back(self) -> None:
        if not self.calls:
            self._buffer = self._lead + self._tag_text() + self._buffer
        self._state = "plain"

    def _tag_text(self) -> str:
        return "" if self.tag == JSON_TAG else self.tag

    def _skip(self, text: str) -> int:
        markers = [m for m in (*self._closings(), self._tag_text(), PYTHON_TAG) if m]
        i = 0
        while i < len(text):
            if text[i] in _SEPARATORS:
                i += 1
                continue
            marker = next((m for m in markers if text.startswith(m, i)), None)
            if marker is None:
                return i
            i += len(marker)
        return i

    def _closings(self) -> list[str]:
        """``</tool_call>`` for ``<tool_call>``."""
        if self.tag.startswith("<") and self.tag.endswith(">") and not self.tag.startswith("<|"):
            return ["</" + self.tag[1:]]
        return []


def parse_calls(text: str, names: set[str] | list[str]) -> list[ToolCall] | None:
    """The calls in one JSON value (a call object or a list of them); None when it is not calls of
    known functions."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_call(item, names) for item in items]
    return calls if calls and all(c is not None for c in calls) else None  # type: ignore[return-value]


def _call(item: Any, names) -> ToolCall | None:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict):  # {"type": "function", "function": {...}}
        item = item["function"]
    name = item.get("name")
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(name, str) or name not in names or not isinstance(arguments, dict):
        return None
    return ToolCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False), id=call_id())


def _json_end(text: str, start: int) -> int:
    """End of the JSON object or array starting at ``start`` (strings and escapes respected); -1 when it
    is not closed yet or does not start there."""
    if start >= len(text) or text[start] not in "{[":
        return -1
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        char = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def _overlap(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
