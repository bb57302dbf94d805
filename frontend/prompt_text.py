"""Prompt text and option translation for the prompt-only APIs (TGI's native ``/generate``, Triton's
``text_input``): chat messages rendered with the configured tokenizer's chat template, a token budget
when the client set none, and option -> wire-field translation with each backend's accepted ranges.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from core.base import GenerationRequest
from .chat_format import PromptSpec, TemplateError, render_chat
from core.errors import BackendUnavailable, InvalidRequest
from .token_count import ByteEstimate, TokenCounter
from frontend.tools.wire import chosen_tools

DEFAULT_MAX_TOKENS = 512


def render_prompt(request: GenerationRequest, spec: PromptSpec) -> str:
    """The text a prompt-only API generates from. Tools are refused (400): these APIs return text only,
    so calls would come back unparsed; ``tool_choice: "none"`` drops them."""
    if request.is_chat:
        if chosen_tools(request.tools, request.tool_choice):
            raise InvalidRequest("tools need a backend that returns tool calls: this one has a prompt-only API "
                                 "(TGI's native /generate, Triton); use TGI with mode: messages or an "
                                 "OpenAI-compatible server", param="tools")
        try:
            return render_chat(spec, request.messages or [])
        except TemplateError as exc:
            raise InvalidRequest(str(exc), param="messages") from None
    if request.system and not request.raw:
        return f"{request.system}\n\n{request.prompt or ''}"
    return request.prompt or ""


@lru_cache(maxsize=16)
def chat_spec(tokenizer: str | None) -> PromptSpec:
    """The chat template that goes with ``settings.tokenizer``; ``PromptSpec()`` = plain transcript."""
    if not tokenizer:
        return PromptSpec()
    path = Path(tokenizer).expanduser()
    try:
        template, eos = _gguf_template(path) if path.suffix == ".gguf" else _hf_template(path.parent)
    except Exception as exc:
        raise BackendUnavailable(f"cannot read the chat template of {path}: {exc}") from None
    return PromptSpec(jinja_template=template or None, eos_token=eos or "")


def _gguf_template(path: Path) -> tuple[str | None, str]:
    from gguf_io.gguf_file import GGUFFile
    from gguf_io.metadata import gguf_value

    reader = GGUFFile(path)  # the fast header walker (gguf-py's GGUFReader takes seconds on a vocabulary)
    eos_id, tokens = gguf_value(reader, "tokenizer.ggml.eos_token_id"), gguf_value(reader, "tokenizer.ggml.tokens")
    eos = tokens[int(eos_id)] if tokens is not None and eos_id is not None else ""
    return gguf_value(reader, "tokenizer.chat_template"), eos


def _hf_template(root: Path) -> tuple[str | None, str]:
    from gguf_io.metadata import hf_chat_template, read_json

    config = read_json(root / "tokenizer_config.json") if (root / "tokenizer_config.json").exists() else {}
    eos = config.get("eos_token") or ""
    return hf_chat_template(root), eos.get("content", "") if isinstance(eos, dict) else str(eos)


def token_budget(num_predict: Any, counter: TokenCounter, prompt: str, total: int | None) -> int:
    """``num_predict`` when > 0 (Ollama: 0, -1 and -2 all mean no limit), else what the context leaves
    after the prompt: counted with the tokenizer + 8 for special tokens, or without one the byte estimate
    plus a quarter (it undercounts non-English text); at least 1. ``DEFAULT_MAX_TOKENS`` if no limit is known."""
    if isinstance(num_predict, int) and num_predict > 0:
        return num_predict
    if not total:
        return DEFAULT_MAX_TOKENS
    estimate = counter.count(prompt)
    margin = math.ceil(estimate / 4) if isinstance(counter, ByteEstimate) else 0
    return max(1, int(total) - estimate - margin - 8)


def translate(options: dict[str, Any], rules: dict[str, tuple[str, Callable[[Any], bool]]]) -> dict[str, Any]:
    """Options -> wire fields: ``rules`` maps an option to (wire name, which values the backend accepts)."""
    return {name: options[key] for key, (name, accept) in rules.items()
            if options.get(key) is not None and accept(options[key])}


def is_greedy(options: dict[str, Any]) -> bool:
    return options.get("temperature") is not None and options["temperature"] <= 0
