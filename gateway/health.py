"""``/`` and ``/api/version`` (the probes clients use), ``/health`` (liveness), ``/ready``
(readiness) and ``/metrics`` (Prometheus).

``/health`` answers 200 ``{"status": "ok"}`` while the process serves. ``/ready`` answers 200 when
something can serve a request: a remote backend whose last health check passed, a model loaded
in an in-process engine, or a model in the local store (the in-process engines load it on first
use); otherwise 503 with the reason. Both are open without an API key, as ``/`` is.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field

from gateway.observability.monitor import HEALTH_TIMEOUT_S
from gateway.ollama.wire_models import VersionResponse, errors

from gateway.version import VERSION

router = APIRouter(tags=["health"])


@router.get("/", response_class=PlainTextResponse, responses=errors(guarded=False))
@router.head("/", response_class=PlainTextResponse, responses=errors(guarded=False))
async def root() -> str:
    return "Ollama is running"


@router.get("/api/version", responses={200: {"model": VersionResponse}, **errors(guarded=False)}, response_model=None)
@router.head("/api/version", responses={200: {"model": VersionResponse, "description": "as GET, no body"},
                                         **errors(guarded=False)}, response_model=None)
async def api_version() -> dict:
    return {"version": VERSION}


@router.get("/metrics", response_class=Response, responses={
    200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
    **errors()})
async def metrics(request: Request) -> Response:
    metrics = request.app.state.metrics
    if metrics.monitor is not None:  # the backends' load figures as they are now
        await metrics.monitor.read_loads()
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)


class Liveness(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "not ready"]
    reason: str = Field(description="what serves (\"vllm-a is up\", \"tiny:latest is loaded\"), or why nothing does")


@router.get("/health", responses={200: {"model": Liveness, "description": "the process serves"},
                                  **errors(guarded=False)}, response_model=None)
async def health() -> dict:
    return {"status": "ok"}


@router.get("/ready", responses={
    200: {"model": Readiness, "description": "a backend is reachable or a local model is available"},
    503: {"model": Readiness, "description": "nothing can serve a request yet"},
    **errors(guarded=False)}, response_model=None)
async def ready(request: Request) -> JSONResponse:
    ok, reason = await readiness(request.app)
    return JSONResponse({"status": "ready" if ok else "not ready", "reason": reason}, status_code=200 if ok else 503)


async def readiness(app) -> tuple[bool, str]:
    """(ready, why): a reachable remote backend, a loaded local model, or a model in the store."""
    monitor, router = app.state.monitor, app.state.router
    with suppress(TimeoutError):  # the first health checks, at most one check's timeout
        await asyncio.wait_for(monitor.first_poll.wait(), HEALTH_TIMEOUT_S + 0.5)
    local = set(router.local.started()) if router.local is not None else set()
    up = [name for name in monitor.any_up() if name not in local]
    if up:
        return True, f"{', '.join(up)} {'is' if len(up) == 1 else 'are'} up"
    if router.local is not None:
        loaded = await router.local.loaded_models()
        if loaded:
            return True, f"{loaded[0].name} is loaded"
        models = await asyncio.to_thread(app.state.store.list_models)
        if models:
            return True, f"{len(models)} local model(s) available"
    down = [f"{s.name}: {s.detail}" for s in monitor.down() if s.name not in local]
    remote = f"no backend is reachable ({'; '.join(down)})" if down else "no remote backend is configured"
    store = "the local store has no model" if router.local is not None else "no local engine"
    return False, f"{remote} and {store}"
