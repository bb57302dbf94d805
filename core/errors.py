"""Errors every backend raises, whatever it talks to.

    BackendError                      base; ``status`` is the HTTP status the gateway answers with
    ├── InvalidRequest                400: a field the backend cannot accept
    │   └── ContextLengthExceeded     400: the prompt does not fit in the context window
    ├── ModelNotFound                 404: the model is not in the store / not served
    ├── QueueFull                     503: too many requests waiting for a slot
    ├── BackendOverloaded             429: a remote backend is saturated; ``retry_after`` seconds
    │   ├── RouteShed                 429: a route refused a request no backend can serve within its SLO
    │   └── RouteUnavailable          503: every backend of a route is out (breakers open, no first token)
    ├── BackendUnavailable            502: the backend cannot be reached or failed to load
    │   ├── RunnerStopped             502: a local model's runner process died or hung (adapters/engines/runner)
    │   └── RunnerBackoff             503: that runner crashed repeatedly; no new one before ``retry_after``
    ├── ShuttingDown                  503: the server stopped this request to shut down
    ├── BackendTimeout                504: the backend did not answer in time
    └── BackendProtocolError          502: the backend answered something we cannot parse

A failure after the first streamed event carries ``partial``: the :class:`~core.base.Done`
of what was generated before it, so the ledger bills and counts those tokens.

Adapters translate their own failures (llama.cpp exceptions, aiohttp errors) into this tree in one
place; the gateway renders it once per API shape (``gateway/errors.py``) and the CLI prints the
message as one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Done


class BackendError(Exception):
    status = 500
    openai_type = "api_error"

    def __init__(self, message: str, *, param: str | None = None, partial: "Done | None" = None,
                 code: str | int | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code  # a remote backend's own error code, passed on as it came (vLLM: the status)
        self.backend_status: int | None = None  # the HTTP status a remote backend answered, when it did
        self.partial = partial  # what was generated before a mid-stream failure


class InvalidRequest(BackendError):
    status = 400
    openai_type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    def __init__(self, prompt_tokens: int, num_ctx: int, *, estimated: bool = False):
        size = f"at least {prompt_tokens} tokens (by its length)" if estimated else f"{prompt_tokens} tokens"
        super().__init__(
            f"the prompt is {size} but the context window is {num_ctx} tokens; "
            "shorten the input, raise num_ctx, or set \"truncate\": true to drop the oldest messages",
            param="messages",
        )
        self.prompt_tokens = prompt_tokens
        self.num_ctx = num_ctx


class ModelNotFound(BackendError):
    status = 404
    openai_type = "not_found_error"

    def __init__(self, model: str, message: str | None = None):
        super().__init__(message or f"model '{model}' not found", param="model")
        self.model = model


class QueueFull(BackendError):
    status = 503

    def __init__(self, model: str):
        super().__init__(f"server busy: too many requests queued for '{model}', retry later")


class BackendOverloaded(BackendError):
    """The backend refused for load (its own 429/503, or ``max_inflight`` reached); clients may retry."""

    status = 429
    openai_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class RouteShed(BackendOverloaded):
    """Admission control refused the request before any backend saw it (its ledger row says ``shed``)."""


class RouteUnavailable(BackendOverloaded):
    status = 503


class BackendUnavailable(BackendError):
    status = 502


class RunnerStopped(BackendUnavailable):
    """The runner serving the request exited (a signal, an exit status) or was killed as hung."""


class RunnerBackoff(BackendUnavailable):
    status = 503

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class ShuttingDown(BackendError):
    status = 503

    def __init__(self) -> None:
        super().__init__("the server is shutting down; retry on another instance or after it restarts")


class BackendTimeout(BackendError):
    status = 504


class BackendProtocolError(BackendError):
    status = 502
