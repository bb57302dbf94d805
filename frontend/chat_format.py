"""Chat prompt formatting: a model's templates plus request messages -> the exact prompt text.

Go TEMPLATE layer first (ollama.md §6.3), else the GGUF's Jinja ``tokenizer.chat_template`` rendered
like Hugging Face's ``apply_chat_template`` (§6.4), else a plain ``Role: text`` transcript.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache

import jinja2

from registry.templates import GoTemplate, TemplateError, to_go

from core.errors import BackendError, InvalidRequest
from frontend.bounded_jinja import BoundedSandbox, render_bounded

__all__ = ["PromptSpec", "TemplateError", "conversation", "fit_messages", "render_chat", "render_generate",
           "render_request"]

# Which template field each role fills in a legacy (pre-.Messages) template's turn.
_LEGACY_FIELDS = {"system": "System", "user": "Prompt", "assistant": "Response"}


@dataclass
class PromptSpec:
    template: str | None = None        # Ollama TEMPLATE layer (Go template)
    jinja_template: str | None = None  # GGUF tokenizer.chat_template (Jinja)
    system: str | None = None          # SYSTEM layer: default system message
    messages: list[dict] = field(default_factory=list)  # MESSAGE layer, prepended to chats
    bos_token: str = ""
    eos_token: str = ""

    @classmethod
    def from_details(cls, details, bos_token: str = "", eos_token: str = "") -> PromptSpec:
        """From a ``registry.details.ModelDetails``."""
        gguf = details.gguf
        return cls(template=details.template, jinja_template=gguf.chat_template if gguf else None,
                   system=details.system, messages=list(details.messages or []),
                   bos_token=bos_token, eos_token=eos_token)


def render_request(spec: PromptSpec, request, count_tokens: Callable[[str], int], limit: int) -> tuple[str, int]:
    """The prompt text for a ``GenerationRequest`` and how many messages were dropped to fit ``limit``.

    A template that fails to render (the request's own ``template``, or a model's) is the request's
    problem: InvalidRequest (400), never a backend failure."""
    try:
        return _render_request(spec, request, count_tokens, limit)
    except BackendError:
        raise
    except Exception as exc:  # TemplateError, Jinja errors, evaluation errors inside either engine
        raise InvalidRequest(f"the prompt template failed: {exc or type(exc).__name__}", param="template") from None


def _render_request(spec: PromptSpec, request, count_tokens: Callable[[str], int], limit: int) -> tuple[str, int]:
    if request.raw:
        return request.prompt or "", 0
    if not request.is_chat:
        return render_generate(spec, request.prompt or "", system=request.system, suffix=request.suffix,
                               template=request.template), 0
    think = getattr(request, "think", None)
    if not request.truncate:
        return render_chat(spec, request.messages or [], tools=request.tools, think=think), 0
    return fit_messages(spec, request.messages or [], count_tokens=count_tokens, limit=limit, tools=request.tools,
                        think=think)


def render_chat(spec: PromptSpec, messages: list[dict], *, tools: list | None = None,
                think: bool | str | None = None) -> str:
    """The prompt for ``/api/chat``: MESSAGE layer, SYSTEM default, then the request's messages.
    ``think`` (None: unset) reaches Go templates as ``.Think``/``.ThinkLevel``/``.IsThinkSet`` and Jinja
    templates as ``enable_thinking`` and ``reasoning_effort`` (a level)."""
    return _render(spec, conversation(spec, messages), tools, think)


def render_generate(spec: PromptSpec, prompt: str, *, system: str | None = None, suffix: str | None = None,
                    template: str | None = None) -> str:
    """The prompt for ``/api/generate`` without ``raw``: the prompt becomes one user message."""
    spec = replace(spec, template=template or spec.template)
    if suffix:
        return _render_insert(spec, prompt, suffix)
    if not spec.template and not spec.jinja_template:
        return prompt
    system = system or spec.system
    head = [{"role": "system", "content": system}] if system else []
    return _render(spec, [*head, *spec.messages, {"role": "user", "content": prompt}], None)


def fit_messages(spec: PromptSpec, messages: list[dict], *, count_tokens: Callable[[str], int], limit: int,
                 tools: list | None = None, think: bool | str | None = None) -> tuple[str, int]:
    """The chat prompt with the fewest oldest non-system messages dropped to fit ``limit`` tokens, and how
    many were dropped. System messages and the last message always stay; if even that is too long, the
    smallest rendering is returned and the caller reports the overflow."""
    convo = conversation(spec, messages)
    droppable = [i for i, message in enumerate(convo[:-1]) if message.get("role") != "system"]

    def render(dropped: int) -> str:
        gone = set(droppable[:dropped])
        return _render(spec, [message for i, message in enumerate(convo) if i not in gone], tools, think)

    prompt = render(0)
    if not droppable or count_tokens(prompt) <= limit:
        return prompt, 0
    low, high = 1, len(droppable)  # bisect: the prompt only shrinks as more messages go
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if count_tokens(render(mid)) <= limit else (mid + 1, high)
    return render(low), low


def conversation(spec: PromptSpec, messages: list[dict]) -> list[dict]:
    """MESSAGE layer + request messages, led by the SYSTEM layer unless the request starts with a system
    message (Ollama's ``chat`` handler)."""
    convo = [*spec.messages, *messages]
    if spec.system and not (messages and messages[0].get("role") == "system"):
        convo.insert(0, {"role": "system", "content": spec.system})
    return convo


def _render(spec: PromptSpec, convo: list[dict], tools: list | None, think: bool | str | None = None) -> str:
    if spec.template:
        return _render_go(spec.template, convo, tools, think)
    if spec.jinja_template:
        return _render_jinja(spec, convo, tools, think)
    return _render_plain(convo)


@lru_cache(maxsize=64)
def _go_template(source: str) -> GoTemplate:
    """Parsed once per source; a template using neither ``.Messages`` nor ``.Response`` gets
    ``{{ .Response }}`` appended, as Ollama does."""
    template = GoTemplate(source)
    if not template.uses("Messages") and not template.uses("Response"):
        template = GoTemplate(source + "{{ .Response }}")
    return template


@lru_cache(maxsize=64)
def _go_generation_prefix(source: str) -> GoTemplate:
    return _go_template(source).cut_after("Response")


def _render_go(source: str, convo: list[dict], tools: list | None, think: bool | str | None = None) -> str:
    template = _go_template(source)
    system, merged = _collate(convo)
    if template.uses("Messages"):
        data = {"System": system, "Messages": to_go(merged), "Tools": to_go(tools) if tools else None, "Response": ""}
        if think is not None:  # Ollama's api.ThinkValue: a level thinks too
            data.update(Think=think is not False, ThinkLevel=think if isinstance(think, str) else "", IsThinkSet=True)
        return template.render(data)
    return _render_legacy(source, merged)


def _collate(convo: list[dict]) -> tuple[str, list[dict]]:
    """All system contents joined, and the messages with consecutive same-role ones merged (not tool)."""
    system = "\n\n".join(m.get("content") or "" for m in convo if m.get("role") == "system")
    merged: list[dict] = []
    for message in convo:
        role = message.get("role")
        if merged and merged[-1].get("role") == role and role != "tool":
            previous = merged[-1]
            merged[-1] = {**previous, "content": f"{previous.get('content') or ''}\n\n{message.get('content') or ''}"}
        else:
            merged.append(dict(message))
    return system, merged


def _render_legacy(source: str, messages: list[dict]) -> str:
    """Render one turn of {System, Prompt, Response} at a time; the last turn only up to ``{{ .Response }}``."""
    parts: list[str] = []
    turn = dict.fromkeys(_LEGACY_FIELDS.values(), "")
    for message in messages:
        role = message.get("role")
        if (role == "system" and (turn["Prompt"] or turn["Response"])) or (role == "user" and turn["Response"]):
            parts.append(_go_template(source).render(turn))
            turn = dict.fromkeys(_LEGACY_FIELDS.values(), "")
        if role in _LEGACY_FIELDS:
            turn[_LEGACY_FIELDS[role]] = message.get("content") or ""
    parts.append(_go_generation_prefix(source).render(turn))
    return "".join(parts)


def _render_insert(spec: PromptSpec, prompt: str, suffix: str) -> str:
    """Fill-in-the-middle: the template sees {Prompt, Suffix, Response: ""}."""
    if not spec.template or not _go_template(spec.template).uses("Suffix"):
        raise InvalidRequest("this model does not support insert (its template has no .Suffix)", param="suffix")
    return _go_template(spec.template).render({"Prompt": prompt, "Suffix": suffix, "Response": ""})


def _render_plain(convo: list[dict]) -> str:
    lines = [f"{(m.get('role') or 'user').capitalize()}: {m.get('content') or ''}\n" for m in convo]
    return "".join(lines) + "Assistant: "


def _raise_exception(message: str):
    raise TemplateError(f"chat template error: {message}")


def _tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False) -> str:
    """Hugging Face's ``tojson``: plain JSON, no HTML escaping."""
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


@lru_cache(maxsize=32)
def _jinja_template(source: str) -> jinja2.Template:
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.bound_filters()
    env.globals.update(raise_exception=_raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"chat template does not parse: line {exc.lineno}: {exc.message}") from None


def _render_jinja(spec: PromptSpec, convo: list[dict], tools: list | None, think: bool | str | None = None) -> str:
    template = _jinja_template(spec.jinja_template or "")
    flags: dict = {}
    if think is not None:  # Qwen3's enable_thinking, gpt-oss's reasoning_effort
        flags["enable_thinking"] = think is not False
        if isinstance(think, str):
            flags["reasoning_effort"] = think
    try:
        return render_bounded(template, messages=convo, tools=tools or None, add_generation_prompt=True,
                              bos_token=spec.bos_token, eos_token=spec.eos_token, **flags)
    except TemplateError:
        raise
    except Exception as exc:  # the template is model data: whatever it raises is a template error
        raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None
