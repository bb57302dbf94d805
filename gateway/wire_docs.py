"""OpenAPI declarations of what the routes answer: error statuses, streams, and the schema fix-ups.

The API modules declare their bodies as pydantic models (``gateway/openai/wire_models.py``,
``gateway/ollama/wire_models.py``) and pass them to the route decorators' ``responses=``, which
FastAPI only documents: nothing is validated or re-serialized at run time.

- ``error_responses``: the error statuses a route answers, each with the API's error body, plus the
  guards' answers every route shares (401 without a valid key when keys are set, 403 with an empty
  body for a foreign Host or Origin, an error body for a key outside its routes; see
  ``gateway/http/guards.py`` and ``gateway/policy/keys.py``).
- ``sse_content`` / ``ndjson_content``: a stream, declared the OpenAPI 3.2 way (``itemSchema`` = one
  event or line; for NDJSON ``schema`` = the whole stream as an array), with the models inlined.
- ``install(app)``: FastAPI documents a 422 for every route with parameters, but this app answers
  validation errors with 400 (``gateway/http/errors.py``); the 422s are dropped from the schema.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, TypeAdapter

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"

STATUS_TEXT = {
    400: "invalid request: a malformed body, a field of the wrong type or value, a prompt that does not fit",
    401: "keys are required (INFER_API_KEYS, or auth in the config) and the request has no valid key "
         "('Authorization: Bearer <key>' or 'x-api-key: <key>'), or its key is revoked",
    403: "the route needs an operator key, or the key may not use this model (error body), or the Host or "
         "Origin header is not allowed (empty body)",
    404: "the model (or blob) is not found",
    413: "the request body is larger than the limit",
    429: "a remote backend is saturated, or the key's rate limit or budget is reached; Retry-After says when "
         "to come back",
    502: "the backend (or registry) failed or answered something unreadable",
    503: "too many requests queued for the model, or the ledger database or Redis (API keys, budgets, rate "
         "limits) is unreachable; Retry-After says when to come back",
    504: "the backend did not answer in time",
    507: "not enough disk space for the model",
}


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    """One generated token's log-probability (both APIs use this shape)."""

    top_logprobs: list[TopLogprob]


def error_responses(error_model: type[BaseModel], statuses: tuple[int, ...] | list[int], *,
                    guarded: bool = True) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for ``statuses`` with ``error_model`` bodies, and the guards' 401/403/413/503."""
    out: dict[int | str, dict[str, Any]] = {}
    extra = (401, 403, 413, 503) if guarded else (403,)
    for status in sorted({*statuses, *extra}):
        out[status] = {"model": error_model, "description": STATUS_TEXT[status]}
    return out


@functools.cache
def inline_schema(tp: Any) -> dict[str, Any]:
    """``tp``'s JSON schema (as serialized) with every ``$ref`` replaced by its definition."""
    schema = TypeAdapter(tp).json_schema(mode="serialization")
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return {**resolve(defs[ref.removeprefix("#/$defs/")]), **resolve(rest)}
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node
    return resolve(schema)


def sse_content(chunk: type[BaseModel], error: type[BaseModel]) -> dict[str, Any]:
    """An SSE stream: events whose ``data`` is a ``chunk`` or an ``error`` as JSON, the last one ``[DONE]``."""
    data = {"anyOf": [{"const": "[DONE]"},
                      {"type": "string", "contentMediaType": "application/json",
                       "contentSchema": {"anyOf": [inline_schema(chunk), inline_schema(error)]}}]}
    event = {"type": "object", "required": ["data"], "properties": {"data": data}}
    return {SSE: {"itemSchema": event}}


def named_sse_content(events: list[type[BaseModel]], error: type[BaseModel]) -> dict[str, Any]:
    """A stream of named events (Anthropic's Messages, OpenAI's Responses): ``event: <name>`` and a ``data``
    that is one of ``events`` or ``error`` as JSON; no ``[DONE]``."""
    schemas = [inline_schema(e) for e in events] + [inline_schema(error)]
    data = {"type": "string", "contentMediaType": "application/json", "contentSchema": {"anyOf": schemas}}
    event = {"type": "object", "required": ["data"], "properties": {"event": {"type": "string"}, "data": data}}
    return {SSE: {"itemSchema": event}}


def ndjson_content(*items: type[BaseModel]) -> dict[str, Any]:
    """An NDJSON stream: one JSON object per line, each one of ``items``."""
    item = inline_schema(items[0]) if len(items) == 1 else {"anyOf": [inline_schema(i) for i in items]}
    return {NDJSON: {"schema": {"type": "array", "items": item}, "itemSchema": item}}


def install(app: FastAPI) -> None:
    """Serve the schema without FastAPI's 422s (this app answers validation errors with 400)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            components = schema.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema
    app.openapi = openapi  # type: ignore[method-assign]
