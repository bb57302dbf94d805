"""An interpreter for the subset of Go ``text/template`` that Ollama model templates use.

Go semantics with ``missingkey=zero``: missing keys and nil print as "", Go truthiness, ``range``
over lists, maps (sorted keys) and ints, short-circuit ``and``/``or``. Maps and lists print as JSON,
as Ollama's ``Tools`` and tool-call ``Arguments`` do; ``to_go`` lets ``.ToolCalls`` read ``tool_calls``.

Templates come from clients (``/api/generate``'s ``template``, a Modelfile's ``TEMPLATE``), so one
render is bounded (:class:`RenderLimits`): loop iterations over the whole render, the output's
length (and any one value a function builds), and time. Past a bound it stops with
:class:`TemplateLimitExceeded` (a 400 for a request) before it has done more than the bound's work:
``{{ range 20000000 }}`` is refused before its first iteration. Ollama's templates loop over the
messages and tools of one request: the limits leave them orders of magnitude of room.
"""

from __future__ import annotations

import copy
import json
import operator
import re
import time
from dataclasses import dataclass
from datetime import date, timedelta
from functools import partial

from .gotemplate_parse import (Action, Branch, Jump, Operand, Pipe, TemplateError, Text, cut_after, error,
                               identifiers, parse)

__all__ = ["GoTemplate", "JSONObject", "RenderLimits", "TemplateError", "TemplateLimitExceeded", "to_go", "to_json",
           "to_text", "truthy"]

_NO_ARG = object()  # "no value piped in", distinct from nil


@dataclass(frozen=True)
class RenderLimits:
    """What one render of a template may do (Go templates here, Jinja chat templates in
    ``frontend/chat_format.py``), on top of what its data asks for: a render may also loop
    8 times per item of the lists in its data, and write twice the text in it (so a long
    conversation, or a prompt too long for any context, still renders, and is refused for its length)."""

    max_iterations: int = 100_000  # loop iterations, all loops of the render together
    max_output: int = 8 << 20  # characters of output, and of any one value a function builds
    max_seconds: float = 1.0

    def for_data(self, data) -> "RenderLimits":
        """These limits, plus what ``data`` (the render's input) needs."""
        items, chars = _size_of(data)
        return RenderLimits(self.max_iterations + 8 * items, self.max_output + 2 * chars, self.max_seconds)


def _size_of(value, depth: int = 0) -> tuple[int, int]:
    """(list items, characters of text) in a JSON-like value."""
    if isinstance(value, str):
        return 0, len(value)
    if depth > 32 or not isinstance(value, (dict, list, tuple)):
        return 0, 0
    values = value.values() if isinstance(value, dict) else value
    items, chars = (0 if isinstance(value, dict) else len(value)), 0
    for item in values:
        more_items, more_chars = _size_of(item, depth + 1)
        items, chars = items + more_items, chars + more_chars
    return items, chars


LIMITS = RenderLimits()


class TemplateLimitExceeded(TemplateError):
    """A render went past one of its :class:`RenderLimits`."""


class Budget:
    """One render's use of its limits; ``spend``/``emit``/``check`` raise TemplateLimitExceeded."""

    __slots__ = ("limits", "iterations", "output", "deadline")

    def __init__(self, limits: RenderLimits = LIMITS) -> None:
        self.limits = limits
        self.iterations = 0
        self.output = 0
        self.deadline = time.monotonic() + limits.max_seconds

    def spend(self, iterations: int) -> None:
        """Count ``iterations`` more loop iterations (all of a ``range`` over an int at once, before it runs)."""
        self.iterations += iterations
        if self.iterations > self.limits.max_iterations:
            raise TemplateLimitExceeded(f"the template loops more than {self.limits.max_iterations} times")
        if self.iterations & 255 == 0:
            self.check_time()

    def emit(self, size: int) -> None:
        self.output += size
        if self.output > self.limits.max_output:
            raise TemplateLimitExceeded(f"the template's output is longer than {self.limits.max_output} characters")

    def value(self, value):
        """``value`` when a function built no string longer than the output limit."""
        if isinstance(value, str) and len(value) > self.limits.max_output:
            raise TemplateLimitExceeded(f"the template builds a value longer than {self.limits.max_output} characters")
        return value

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitExceeded(f"the template took more than {self.limits.max_seconds:g} s to render")


class JSONObject(dict):
    """A JSON object seen by templates as a Go struct: ``.ToolCalls`` reads the key ``tool_calls``."""


def to_go(value):
    """Wrap request JSON (messages, tools) so templates can use Go field names on it."""
    if isinstance(value, dict):
        return JSONObject({key: to_go(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return [to_go(item) for item in value]
    return value


def truthy(value) -> bool:
    if isinstance(value, (bool, int, float, str, list, tuple, dict)):
        return bool(value)
    return value is not None


def to_json(value) -> str:
    """Go's ``json.Marshal``: compact, with ``<``, ``>`` and ``&`` escaped."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for char in "<>&\u2028\u2029":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text


def to_text(value) -> str:
    """How ``{{ value }}`` prints."""
    if value is None or value is _NO_ARG:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value).removesuffix(".0")
    if isinstance(value, (dict, list, tuple)):
        return to_json(value)
    return str(value)


def _kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return "string" if isinstance(value, str) else type(value).__name__


def eq(a, *others) -> bool:
    if not others:
        raise TypeError("missing argument for comparison")
    return any(_equal(a, b) for b in others)


def _equal(a, b) -> bool:
    if a is None or b is None:  # nil is the zero value of whatever it is compared with
        return not truthy(a) and not truthy(b)
    if _kind(a) != _kind(b):
        raise TypeError(f"incompatible types for comparison: {_kind(a)} and {_kind(b)}")
    return a == b


def _ordered(compare):
    def ordered(a, b) -> bool:
        a = type(b)() if a is None and isinstance(b, (int, float, str)) else a
        b = type(a)() if b is None and isinstance(a, (int, float, str)) else b
        if _kind(a) != _kind(b) or _kind(a) not in ("number", "string"):
            raise TypeError(f"incompatible types for comparison: {_kind(a)} and {_kind(b)}")
        return compare(a, b)
    return ordered


def length(value) -> int:
    if value is not None and not isinstance(value, (str, list, tuple, dict)):
        raise TypeError(f"len of {_kind(value)}")
    return len(value or ())


def index(value, *keys):
    for key in keys:
        if value is None:
            return None
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, (list, tuple, str)):
            if not isinstance(key, int) or not 0 <= key < len(value):
                raise IndexError(f"index out of range: {key}")
            value = value[key]
        else:
            raise TypeError(f"can't index item of type {_kind(value)}")
    return value


def slice_(value, *bounds):
    if not isinstance(value, (str, list, tuple)) or len(bounds) > 2:
        raise TypeError(f"can't slice item of type {_kind(value)}")
    start, end = (*bounds, len(value))[:2] if bounds else (0, len(value))
    if not 0 <= start <= end <= len(value):
        raise IndexError(f"slice bounds out of range [{start}:{end}]")
    return value[start:end]


def sprint(*args) -> str:
    """Go's ``fmt.Sprint``: a space between operands when neither is a string."""
    parts = []
    for i, arg in enumerate(args):
        if i and not isinstance(arg, str) and not isinstance(args[i - 1], str):
            parts.append(" ")
        parts.append(to_text(arg))
    return "".join(parts)


_VERB = re.compile(r"%[-+# 0]*\d*(?:\.\d+)?([a-zA-Z%])")


def printf(fmt: str, *args) -> str:
    """Go's ``fmt.Sprintf`` for the simple verbs: %v %s %d %t print the value, %q quotes it."""
    pending = list(args)

    def one(match: re.Match) -> str:
        verb = match.group(1)
        if verb == "%" or not pending:
            return "%" if verb == "%" else f"%!{verb}(MISSING)"
        text = to_text(pending.pop(0))
        return json.dumps(text, ensure_ascii=False) if verb == "q" else text

    return _VERB.sub(one, fmt)


FUNCS = {
    "and": None, "or": None,  # short-circuit: evaluated by _Exec.call
    "not": lambda value: not truthy(value),
    "eq": eq, "ne": lambda a, b: not eq(a, b),
    "lt": _ordered(operator.lt), "le": _ordered(operator.le),
    "gt": _ordered(operator.gt), "ge": _ordered(operator.ge),
    "len": length, "index": index, "slice": slice_,
    "print": sprint, "printf": printf, "println": lambda *args: " ".join(map(to_text, args)) + "\n",
    "json": to_json,
    "currentDate": lambda: date.today().isoformat(),
    "yesterdayDate": lambda: (date.today() - timedelta(days=1)).isoformat(),
}


class _Jump(Exception):
    """``{{break}}`` or ``{{continue}}``, unwinding to the enclosing range."""


class GoTemplate:
    """A parsed Go template; ``render(data)`` executes it on a dict of top-level fields."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._nodes = parse(source, frozenset(FUNCS))
        self._names = {name.lower() for name in identifiers(self._nodes)}

    def uses(self, name: str) -> bool:
        """Whether the template references the field (``"Messages"`` or ``".Messages"``), as
        Ollama decides it: any field name anywhere in the template, case-insensitively."""
        return name.lstrip(".").lower() in self._names

    def cut_after(self, name: str) -> GoTemplate:
        """This template ending right after the first action that prints ``name``."""
        cut = copy.copy(self)
        cut._nodes = cut_after(self._nodes, name)[0]
        return cut

    def render(self, data: dict, limits: RenderLimits | None = None) -> str:
        """The template run on ``data``, within ``limits`` (default: ``LIMITS`` for this data)."""
        run = _Exec(self.source, data, Budget(limits or LIMITS.for_data(data)))
        run.walk(self._nodes, data)
        return "".join(run.out)


class _Exec:
    """One execution: output buffer, the variable stack and the render's budget."""

    def __init__(self, source: str, root, budget: Budget) -> None:
        self.source = source
        self.out: list[str] = []
        self.vars: list[list] = [["$", root]]
        self.budget = budget

    def walk(self, nodes: list, dot) -> None:
        for node in nodes:
            if isinstance(node, Text):
                self.budget.emit(len(node.text))
                self.out.append(node.text)
            elif isinstance(node, Action):
                value = self.pipe(node.pipe, dot)
                if not node.pipe.decl:
                    text = to_text(value)
                    self.budget.emit(len(text))
                    self.out.append(text)
            elif isinstance(node, Branch):
                self.branch(node, dot)
            elif isinstance(node, Jump):
                raise _Jump(node.kind)

    def branch(self, node: Branch, dot) -> None:
        mark = len(self.vars)
        try:
            if node.kind == "range":
                self.range(node, dot)
                return
            value = self.pipe(node.pipe, dot)
            if truthy(value):
                self.walk(node.body, value if node.kind == "with" else dot)
            elif node.else_body is not None:
                self.walk(node.else_body, dot)
        finally:
            del self.vars[mark:]

    def range(self, node: Branch, dot) -> None:
        items = self.items(self.pipe(node.pipe, dot, bind=False), node.pos)
        if not items and node.else_body is not None:
            self.walk(node.else_body, dot)
        mark = len(self.vars)
        for key, value in items:
            self.budget.spend(1)
            del self.vars[mark:]
            for name, bound in zip(node.pipe.decl, (value,) if len(node.pipe.decl) == 1 else (key, value)):
                self.bind(name, bound, node.pipe.assign)
            try:
                self.walk(node.body, value)
            except _Jump as jump:
                if jump.args[0] == "break":
                    break

    def items(self, value, pos: int):
        if value is None:
            return ()
        if isinstance(value, dict):
            return [(key, value[key]) for key in sorted(value, key=str)]
        if isinstance(value, (list, tuple)):
            return list(enumerate(value))
        if isinstance(value, int) and not isinstance(value, bool):
            if value > self.budget.limits.max_iterations - self.budget.iterations:  # refused before it runs
                self.budget.spend(max(0, value))
            return _IntRange(value)
        raise error(self.source, pos, f"range can't iterate over {to_text(value)}")

    def pipe(self, pipe: Pipe, dot, bind: bool = True):
        value = _NO_ARG
        for cmd in pipe.cmds:
            head = cmd[0]
            value = self.call(head, cmd[1:], dot, value) if head.kind == "func" else self.operand(head, dot)
        for name in pipe.decl if bind else ():
            self.bind(name, value, pipe.assign)
        return value

    def bind(self, name: str, value, assign: bool) -> None:
        for slot in reversed(self.vars) if assign else ():
            if slot[0] == name:
                slot[1] = value
                return
        self.vars.append([name, value])

    def call(self, head: Operand, args: list[Operand], dot, piped):
        thunks = [partial(self.operand, arg, dot) for arg in args]
        if piped is not _NO_ARG:
            thunks.append(lambda: piped)
        try:
            if head.value in ("and", "or"):
                return _logic(head.value == "or", thunks)
            self.budget.check_time()
            return self.budget.value(FUNCS[head.value](*(thunk() for thunk in thunks)))  # type: ignore[misc]
        except TemplateError:
            raise
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise error(self.source, head.pos, f"error calling {head.value}: {exc}") from None

    def operand(self, op: Operand, dot):
        if op.kind == "lit":
            return op.value
        if op.kind == "func":
            return self.call(op, [], dot, _NO_ARG)
        if op.kind == "var":
            value = self.lookup(op)
        else:
            value = self.pipe(op.value, dot) if op.kind == "pipe" else dot  # type: ignore[arg-type]
        for name in op.names:
            value = self.field(value, name, op.pos)
        return value

    def lookup(self, op: Operand):
        for name, value in reversed(self.vars):
            if name == op.value:
                return value
        raise error(self.source, op.pos, f"undefined variable {op.value!r}")

    def field(self, value, name: str, pos: int):
        if isinstance(value, dict):
            if name in value or not isinstance(value, JSONObject):
                return value.get(name)
            return value.get(_snake_case(name))
        if value is None:
            return None
        raise error(self.source, pos, f"can't evaluate field {name} in type {_kind(value)}")


class _IntRange:
    """``range N`` over an int: (i, i) pairs made as the loop runs, not a list of N up front."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return max(0, self.n)

    def __iter__(self):
        return ((i, i) for i in range(self.n))


def _logic(want: bool, thunks: list):
    """``and`` (want False) / ``or`` (want True): the first argument whose truth is ``want``, else the last."""
    if not thunks:
        raise TypeError("wrong number of args: want at least 1 got 0")
    for thunk in thunks:
        value = thunk()
        if truthy(value) == want:
            return value
    return value


def _snake_case(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()
