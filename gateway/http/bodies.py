"""Request bodies are JSON whatever their Content-Type, as Ollama's server treats them.

``curl -d '{...}'`` sends ``application/x-www-form-urlencoded``, LiteLLM's async client and proxy send
``application/octet-stream`` to ``/api/chat``, and clients in the wild send no Content-Type at all.
FastAPI only parses bodies declared as JSON, so this middleware declares them: on API routes (not
blob uploads), any Content-Type that is not already JSON becomes ``application/json``.
"""

from __future__ import annotations

import contextvars
from typing import Any

from pydantic import ValidationInfo


class JSONBodies:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and _is_api_body(scope):
            scope = dict(scope)
            scope["headers"] = _as_json(scope["headers"])
        await self.app(scope, receive, send)


def _is_api_body(scope) -> bool:
    path = scope["path"]
    return (scope["method"] in ("POST", "PUT", "PATCH", "DELETE")
            and path.startswith(("/api/", "/v1/")) and not path.startswith("/api/blobs/"))


def _as_json(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    current = next((v for k, v in headers if k.lower() == b"content-type"), b"")
    media = current.split(b";")[0].strip().lower()
    if media == b"application/json" or media.endswith(b"+json"):
        return headers
    kept = [(k, v) for k, v in headers if k.lower() != b"content-type"]
    return [*kept, (b"content-type", b"application/json")]


PARSED_STRICTLY = {"strict_json": True}  # validation context: orjson parsed it, and orjson refuses lone surrogates
# Set while a FastAPI route validates a body orjson parsed (``gateway/http/limits.py``): orjson already refused
# lone surrogates, so the request models' text walk is skipped.
strictly_parsed: contextvars.ContextVar[bool] = contextvars.ContextVar("strictly_parsed", default=False)


def checked_text(cls, value: Any, info: ValidationInfo) -> Any:
    """The request models' before-validator: :func:`check_text`, unless the body was parsed by orjson
    (the hot routes, and the prompt routes ``gateway/http/limits.py`` parsed), which already refuses what
    it refuses."""
    if (info.context and info.context.get("strict_json")) or strictly_parsed.get():
        return value
    return check_text(value)


def check_text(value: Any) -> Any:
    """Refuse a JSON body whose strings hold lone UTF-16 surrogates (``"\\ud800"``): valid JSON, but no
    Unicode text, so no tokenizer can take it. Request models call this before validation (400)."""
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"text must be valid Unicode: a lone surrogate {value[exc.start]!r} "
                                 f"at position {exc.start}") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key)
            check_text(item)
    elif isinstance(value, list):
        for item in value:
            check_text(item)
    return value
