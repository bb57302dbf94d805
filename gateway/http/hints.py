"""What a client may say about one request in headers, on both APIs: ``x-slo-ttft-ms`` and
``x-slo-tpot-ms`` tighten the SLO of the route it names (never loosen it), ``x-priority`` is an
integer (negative: shed first). A malformed value is a 400 naming the header.

The hints also carry who the request is from (the access principal the guard middleware put in the
scope's state), for the recorder: a ledger key's budget and limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from core.base import GenerationRequest

from gateway.http.errors import APIError


@dataclass(frozen=True)
class RequestHints:
    priority: int = 0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    caller: Any = field(default=None, repr=False)  # gateway.policy.access.Principal, or None

    def apply(self, request: GenerationRequest) -> GenerationRequest:
        request.priority, request.slo_ttft_ms, request.slo_tpot_ms = self.priority, self.slo_ttft_ms, self.slo_tpot_ms
        request.caller = self.caller
        return request


NONE = RequestHints()


async def hints_of(request: Request) -> RequestHints:
    return hints_from(request.headers, request.scope)


def caller_of(scope) -> Any:
    """Who the guard middleware found the request is from (None: no key, or auth off without one)."""
    state = scope.get("state")
    return state.get("principal") if state else None


def hints_from(headers, scope) -> RequestHints:
    """The hints in ``headers`` (any mapping with ``get`` and ``in``, lower-case names) and the
    request's caller from ``scope``."""
    caller = caller_of(scope)
    if "x-priority" not in headers and "x-slo-ttft-ms" not in headers and "x-slo-tpot-ms" not in headers:
        return NONE if caller is None else RequestHints(caller=caller)
    return RequestHints(priority=int(_number(headers, "x-priority", integer=True) or 0),
                        slo_ttft_ms=_number(headers, "x-slo-ttft-ms"), slo_tpot_ms=_number(headers, "x-slo-tpot-ms"),
                        caller=caller)


def _number(headers, name: str, *, integer: bool = False) -> float | None:
    text = headers.get(name)
    if text is None:
        return None
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number of milliseconds"
        raise APIError(400, f"header {name} must be {kind}, got {text!r}", param=name) from None
    if not integer and not value > 0:
        raise APIError(400, f"header {name} must be a positive number of milliseconds", param=name)
    return value


HintsDep = Annotated[RequestHints, Depends(hints_of)]
