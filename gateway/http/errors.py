"""The one place where errors become HTTP answers.

Routes under ``/v1`` answer in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``, except
Anthropic's Messages API (``/v1/messages…``): ``{"type": "error", "error": {"type", "message"}}``;
every other route answers in Ollama's ``{"error": "..."}``. Statuses follow ``core.errors`` and
the registry mapping below; nothing a client sends can produce a 500.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from core.errors import BackendError
from registry import errors as reg

if TYPE_CHECKING:  # `infer run` uses the mapping below through the recorder without the web stack
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_REGISTRY_STATUS: list[tuple[type[reg.RegistryError], int]] = [
    (reg.InvalidName, 400), (reg.ModelNotFound, 404), (reg.ModelfileError, 400),
    (reg.ModelFormatError, 400), (reg.DigestMismatch, 400), (reg.AuthError, 401),
    (reg.RegistryUnreachable, 502), (reg.RegistryHTTPError, 502), (reg.DiskFull, 507),
]
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
                 429: "rate_limit_error"}


class APIError(Exception):
    """An error a route raises directly (bad field combination, unsupported value)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def registry_status(exc: reg.RegistryError) -> int:
    return next((status for cls, status in _REGISTRY_STATUS if isinstance(exc, cls)), 500)


# Anthropic's error types (https://docs.anthropic.com/en/api/errors), by status.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                    403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
                    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                    504: "timeout_error", 529: "overloaded_error"}
ANTHROPIC_PREFIX = "/v1/messages"


def error_body(path: str, status: int, message: str, *, param: str | None = None,
               code: str | int | None = None, kind: str | None = None) -> dict:
    if not path.startswith("/v1"):
        return {"error": message}
    if path.startswith(ANTHROPIC_PREFIX):  # Anthropic's Messages API: its own shape
        return anthropic_error(status, message)
    kind = kind or _OPENAI_TYPES.get(status, "api_error")
    message, param = in_route_terms(path, message, param)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# The output limit as a route names it where that is not the chat field the backend was sent.
_LIMIT_FIELD = {"/v1/responses": "max_output_tokens"}
_LIMIT_WORDS = re.compile(r"\bmax_(?:completion_)?tokens\b")


def in_route_terms(path: str, message: str, param: str | None) -> tuple[str, str | None]:
    """A backend's error about ``max_tokens`` in the words of the route the client called (the Responses
    API's ``max_output_tokens``, as vLLM's own Responses route says it)."""
    name = _LIMIT_FIELD.get(path)
    if name is None:
        return message, param
    return _LIMIT_WORDS.sub(name, message), name if param and _LIMIT_WORDS.fullmatch(param) else param


def anthropic_error(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}


def error_response(request: Request, status: int, message: str, **extra) -> JSONResponse:
    from fastapi.responses import JSONResponse

    return JSONResponse(error_body(request.url.path, status, message, **extra), status_code=status)


def to_status_message(exc: BaseException) -> tuple[int, str, dict]:
    """(status, message, extra fields) for any exception, used by handlers and by mid-stream errors."""
    if isinstance(exc, BackendError):
        code = "context_length_exceeded" if type(exc).__name__ == "ContextLengthExceeded" else exc.code
        return exc.status, exc.message, {"param": exc.param, "code": code, "kind": exc.openai_type}
    if isinstance(exc, APIError):
        return exc.status, exc.message, {"param": exc.param, "code": exc.code}
    if isinstance(exc, reg.RegistryError):
        return registry_status(exc), str(exc), {}
    log.exception("unexpected error", exc_info=exc)
    return 500, f"internal error: {type(exc).__name__}", {}


# What the app's handlers answer for; the hot routes (gateway/http/hot.py) render the same ones.
KNOWN = (BackendError, APIError, reg.RegistryError)


def known_error_response(path: str, exc: Exception) -> JSONResponse:
    """The answer to ``exc`` on ``path``, with Retry-After and a key's remaining limits when known."""
    from fastapi.responses import JSONResponse

    status, message, extra = to_status_message(exc)
    response = JSONResponse(error_body(path, status, message, **extra), status_code=status)
    if status >= 500 and not isinstance(exc, KNOWN):  # an unexpected failure: the server closes this connection
        response.headers["Connection"] = "close"
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:  # an overloaded backend: tell clients when to come back
        response.headers["Retry-After"] = str(max(1, round(retry_after)))
    for kind, left in (getattr(exc, "remaining", None) or {}).items():  # a key's per-minute limits
        if left >= 0:
            response.headers[f"x-ratelimit-remaining-{kind}"] = str(left)
    return response


def install(app: FastAPI) -> None:
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    async def handle_known(request: Request, exc: Exception) -> JSONResponse:
        return known_error_response(request.url.path, exc)

    async def handle_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request, 400, validation_message(exc.errors()), param=_param(exc.errors()))

    async def handle_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404 and message == "Not Found":
            message = f"{request.method} {request.url.path} not found"
        if exc.status_code == 405:
            message = f"method {request.method} not allowed for {request.url.path}"
        return error_response(request, exc.status_code, message)

    for cls in KNOWN:
        app.add_exception_handler(cls, handle_known)
    app.add_exception_handler(RequestValidationError, handle_validation)
    app.add_exception_handler(StarletteHTTPException, handle_http)
    app.add_exception_handler(Exception, handle_known)


def validation_message(errors) -> str:
    """One readable sentence from pydantic/FastAPI validation errors. A field that takes one of
    several types (``stop``: a string or a list of strings) names them, not pydantic's union paths."""
    if not errors:
        return "invalid request"
    err = errors[0]
    if err.get("type") == "json_invalid":
        return f"invalid JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}"
    field = ".".join(_fields(err))
    kinds = _kinds(errors)
    if kinds:
        return f"invalid '{field}': expected {' or '.join(kinds)}, got {repr(err.get('input'))[:80]}"
    msg = err.get("msg", "invalid value").removeprefix("Value error, ")
    return f"invalid '{field}': {msg}" if field else f"invalid request body: {msg}"


def _fields(err: dict) -> list[str]:
    """The field path of a pydantic error without the union members pydantic names in it
    (``stop.str``, ``content.list[ContentPart]``, ``function-after[...]``): the path a client wrote."""
    return [str(p) for p in err.get("loc", ()) if p != "body" and not _is_member_tag(p)]


def _is_member_tag(part) -> bool:
    if not isinstance(part, str):
        return False
    return "[" in part or part in ("str", "int", "float", "bool", "dict", "list", "none", "tagged-union")


_KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false", "none": "null",
          "list[str]": "a list of strings", "list[int]": "a list of integers (token ids)",
          "list[list[int]]": "a list of token-id lists", "list[any]": "a list", "dict[str,any]": "an object",
          "list[dict[str,any]]": "a list of objects"}


def _kinds(errors) -> list[str]:
    """The types a field takes when the first error is one member of a union failing (pydantic puts
    each member's tag right after the field's path), in words; [] otherwise."""
    loc = [str(p) for p in errors[0].get("loc", ()) if p != "body"]
    field = _fields(errors[0])
    at = len(field)
    if len(loc) <= at or loc[:at] != field or loc[at] not in _KINDS:
        return []
    kinds = []
    for other in errors:
        path = [str(p) for p in other.get("loc", ()) if p != "body"]
        if path[:at] == field and len(path) > at and path[at] in _KINDS:
            kinds.append(_KINDS[path[at]])
    return list(dict.fromkeys(kinds)) if len(kinds) > 1 else []


def _param(errors) -> str | None:
    if not errors or errors[0].get("type") == "json_invalid":  # its loc is a byte offset, not a field
        return None
    return ".".join(_fields(errors[0])) or None
