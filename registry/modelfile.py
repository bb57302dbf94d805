"""Modelfile parsing and rendering (Ollama's syntax).

``# comment`` lines; ``INSTRUCTION args`` with case-insensitive instructions; values are a
bare rest-of-line, a ``"quoted string"`` or a ``\"\"\"multi-line string\"\"\"``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .errors import ModelfileError

INSTRUCTIONS = ("from", "parameter", "template", "system", "license", "message", "adapter")
ROLES = ("system", "user", "assistant")

# Ollama's runtime options and their types; `stop` may repeat.
PARAMETER_TYPES: dict[str, type] = {
    "num_keep": int, "seed": int, "num_predict": int, "top_k": int, "top_p": float,
    "min_p": float, "typical_p": float, "repeat_last_n": int, "temperature": float,
    "repeat_penalty": float, "presence_penalty": float, "frequency_penalty": float,
    "num_ctx": int, "num_batch": int, "num_gpu": int, "main_gpu": int, "num_thread": int,
    "use_mmap": bool, "stop": list, "speculative": str,
    "tensor_parallel": int,  # infer's: ranks the native engine splits the model over
}


@dataclass
class Modelfile:
    from_: str = ""
    parameters: dict = field(default_factory=dict)
    template: str | None = None
    system: str | None = None
    licenses: list[str] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    adapters: list[str] = field(default_factory=list)


def parse_modelfile(text: str) -> Modelfile:
    mf = Modelfile()
    for lineno, instruction, value in _commands(text):
        try:
            _apply(mf, instruction, value)
        except ModelfileError as exc:
            raise ModelfileError(f"Modelfile line {lineno}: {exc}") from None
    if not mf.from_:
        raise ModelfileError("no FROM line in the Modelfile; add e.g. 'FROM ./model.gguf'")
    return mf


def _apply(mf: Modelfile, instruction: str, value: str) -> None:
    if instruction == "from":
        mf.from_ = value
    elif instruction == "parameter":
        name, _, raw = value.partition(" ")
        parsed = parse_parameter(name, _unquote(raw.strip()))
        if name == "stop":
            mf.parameters.setdefault("stop", []).extend(parsed["stop"])
        else:
            mf.parameters.update(parsed)
    elif instruction in ("template", "system"):
        setattr(mf, instruction, value)
    elif instruction == "license":
        mf.licenses.append(value)
    elif instruction == "adapter":
        mf.adapters.append(value)
    elif instruction == "message":
        role, _, content = value.partition(" ")
        if role.lower() not in ROLES:
            raise ModelfileError(f"MESSAGE role must be one of {', '.join(ROLES)}, got {role!r}")
        mf.messages.append({"role": role.lower(), "content": _unquote(content.strip())})


def parse_parameter(name: str, raw: str) -> dict:
    kind = PARAMETER_TYPES.get(name)
    if kind is None:
        raise ModelfileError(f"unknown parameter {name!r}; known: {', '.join(sorted(PARAMETER_TYPES))}")
    if not raw:
        raise ModelfileError(f"PARAMETER {name} needs a value")
    try:
        if kind is list:
            return {name: [raw]}
        if kind is bool:
            if raw.lower() not in ("true", "false"):
                raise ValueError(raw)
            return {name: raw.lower() == "true"}
        return {name: kind(raw)}
    except ValueError:
        raise ModelfileError(f"PARAMETER {name} expects {kind.__name__}, got {raw!r}") from None


def _commands(text: str):
    """Yield (line number, lowercase instruction, value) triples."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        lineno, line = i + 1, lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.lower()
        if instruction not in INSTRUCTIONS:
            raise ModelfileError(f"Modelfile line {lineno}: command must be one of "
                                 f"{', '.join(i.upper() for i in INSTRUCTIONS)}, got {instruction.upper()!r}")
        rest = rest.strip()
        if '"""' in rest and (rest.startswith('"""') or instruction == "message"):
            rest, i = _multiline(rest, lines, i, lineno)
        elif instruction in ("template", "system", "license"):
            rest = _unquote(rest)
        yield lineno, instruction, rest


def _multiline(rest: str, lines: list[str], i: int, lineno: int) -> tuple[str, int]:
    head, _, body = rest.partition('"""')
    parts = [body]
    while '"""' not in parts[-1]:
        if i >= len(lines):
            raise ModelfileError(f'Modelfile line {lineno}: unterminated """ string')
        parts.append(lines[i])
        i += 1
    text = "\n".join(parts)
    text = text[: text.index('"""')]
    return (head + text if head else text), i


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def render_modelfile(*, from_: str, template: str | None, system: str | None, parameters: dict,
                     licenses: list[str], messages: list[dict], header: str = "", adapters: list[str] = ()) -> str:
    out = [header] if header else []
    out.append(f"FROM {from_}")
    out.extend(f"ADAPTER {path}" for path in adapters)
    if template:
        out.append(f'TEMPLATE """{template}"""')
    if system:
        out.append(f'SYSTEM """{system}"""')
    for key, value in parameters.items():
        for item in value if isinstance(value, list) else [value]:
            out.append(f"PARAMETER {key} {json.dumps(item) if isinstance(item, bool) else item}")
    out.extend(f'LICENSE """{text}"""' for text in licenses)
    out.extend(f"MESSAGE {m['role']} {m['content']}" for m in messages)
    return "\n".join(out) + "\n"
