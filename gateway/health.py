"""``/`` and ``/api/version`` (the probes clients use) and ``/metrics`` (Prometheus)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.ollama.wire_models import VersionResponse, errors

try:
    VERSION = version("infer")
except PackageNotFoundError:  # running from a source tree that was not installed
    VERSION = "0.0.0"

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
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
