"""Jinja's immutable sandbox with bounded work: a chat template from a model file renders within the
same :class:`~registry.templates.RenderLimits` as a Go template (loop iterations, output length,
the length of any one value it builds, time), or stops with ``TemplateLimitExceeded``.

The sandbox already refuses unsafe attributes and ``range`` over more than 100,000 items; what it
leaves open is work: nested loops, values that double (``s * n``, ``s ~ s`` in a loop), wide
formats (``"%0999999999d"``, ``"x"|center(10**9)``), big powers. So, in this environment:

- every ``for`` loop's iterable is wrapped (the parsed template is rewritten before it compiles) so
  each iteration counts against the render's loop budget and its time;
- ``*``, ``**``, ``%``, ``+`` and ``~`` check the size of what they would build before building it;
- every call and filter checks the time, refuses an integer argument larger than the output limit
  (a width or a count) and checks the size of what it returned;
- ``str.format`` and ``%`` refuse a field width larger than the output limit;
- the output is counted as it is produced (``Template.generate``).

The budget of the render in progress lives in a context variable, so one compiled template serves
every thread.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextvars import ContextVar
from functools import wraps
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from registry.templates import LIMITS, Budget, RenderLimits, TemplateLimitExceeded

__all__ = ["BoundedSandbox", "render_bounded"]

_BUDGET: ContextVar[Budget | None] = ContextVar("jinja_budget", default=None)
_LOOP, _CONCAT = "infer_bounded_loop", "infer_bounded_concat"
_NUMBER = re.compile(r"\d+")


def _budget() -> Budget:
    budget = _BUDGET.get()
    if budget is None:  # rendering outside render_bounded (tests, tools): a budget of its own
        budget = Budget()
        _BUDGET.set(budget)
    return budget


def _loop(iterable: Any) -> Iterator[Any]:
    budget = _budget()
    for item in iterable:
        budget.spend(1)
        yield item


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else 0


def _concat(*parts: Any) -> str:
    texts = [str(p) for p in parts]
    _too_long(sum(map(len, texts)))
    return "".join(texts)


def _too_long(size: int, *, items: bool = False) -> None:
    limits = _budget().limits
    if items and size > limits.max_iterations:
        raise TemplateLimitExceeded(f"the template builds a list longer than {limits.max_iterations} items")
    if size > limits.max_output:
        raise TemplateLimitExceeded(f"the template builds a value longer than {limits.max_output} characters")


def _check_widths(fmt: Any) -> None:
    """A format string whose numbers (widths, precisions) ask for more than the output limit is refused."""
    if isinstance(fmt, str) and any(int(n) > _budget().limits.max_output for n in _NUMBER.findall(fmt)):
        raise TemplateLimitExceeded("the template formats a field wider than its output limit")


def _check_args(args: tuple, kwargs: dict) -> None:
    limit = _budget().limits.max_output
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limit:
            raise TemplateLimitExceeded(f"the template passes {value} to a function (at most {limit})")


def _bounded_filter(func):
    @wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.check_time()
        _check_args(args, kwargs)
        result = func(*args, **kwargs)
        _too_long(_size(result))
        return result
    return bounded


def _range(*args: int) -> range:
    _check_args(args, {})
    numbers = range(*args)
    budget = _budget()
    if len(numbers) > budget.limits.max_iterations - budget.iterations:  # refused before it runs
        budget.spend(len(numbers))
    return numbers


class BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.globals.pop("lipsum", None)  # text of any length, by design
        self.globals.update({"range": _range, _LOOP: _loop, _CONCAT: _concat})

    def bound_filters(self) -> None:
        """Every filter (call after adding the environment's own) checks time, arguments and result size."""
        self.filters = {name: _bounded_filter(func) for name, func in self.filters.items()}

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(nodes.Name(_LOOP, "load"), [loop.iter], [], None, None, lineno=loop.lineno)
        for concat in list(tree.find_all(nodes.Concat)):
            call = nodes.Call(nodes.Name(_CONCAT, "load"), list(concat.nodes), [], None, None, lineno=concat.lineno)
            concat.nodes = [call]
        return tree

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja's signature)
        _budget().check_time()
        _check_args(args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        _too_long(_size(result))
        return result

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(times, int) and _size(seq):
                    _too_long(_size(seq) * times, items=isinstance(seq, (list, tuple)))
        elif operator == "+" and _size(left) and _size(right):
            _too_long(_size(left) + _size(right), items=isinstance(left, (list, tuple)))
        elif operator == "%" and isinstance(left, str):
            _check_widths(left)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            if abs(left) > 1 and right * max(1, abs(left).bit_length()) > 64 * 1024:
                raise TemplateLimitExceeded("the template raises a number to a power too large to compute")
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any):
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        _check_widths(value.__self__)
        return wrapped

    def unsafe_undefined(self, obj: Any, attribute: str):
        """Refuses unsafe attributes (``''.__class__``) outright instead of rendering them as empty."""
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def render_bounded(template, limits: RenderLimits | None = None, **context: Any) -> str:
    """``template.render(**context)`` within ``limits`` (default: ``LIMITS`` for this context)."""
    budget = Budget(limits or LIMITS.for_data(context))
    token = _BUDGET.set(budget)
    try:
        parts = []
        for piece in template.generate(**context):
            budget.emit(len(piece))
            budget.check_time()
            parts.append(piece)
        return "".join(parts)
    finally:
        _BUDGET.reset(token)
