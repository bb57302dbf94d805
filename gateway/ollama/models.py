"""Ollama model management: tags, show, ps, pull, push, create, copy, delete and blobs.

Listings read the local store; ``/api/ps`` asks the backend what it has loaded. Pull, push and
create stream Ollama's status lines as NDJSON (``"stream": false``: one ``{"status":"success"}``).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from core.errors import ModelNotFound
from registry.names import parse_digest

from gateway.ollama import views as view
from gateway.deps import CallerDep, RouterDep, SettingsDep, StoreDep, check_model
from gateway.ollama.local import listing_details, local_details, resolve_local
from gateway.ollama.registry_jobs import (Job, copy_model, create_job, progress_stream, pull_job, push_job, receive_blob,
                               run_quietly)
from gateway.ollama.schemas import CopyRequest, CreateRequest, ModelRequest, PullRequest, ShowRequest
from gateway.http.streaming import ndjson_response
from gateway.ollama import wire_models as wire

router = APIRouter(tags=["ollama"])


@router.get("/api/tags", responses={200: {"model": wire.ListResponse}, **wire.errors()}, response_model=None)
@router.head("/api/tags", responses={200: {"model": wire.ListResponse, "description": "as GET, no body"}, **wire.errors()},
             response_model=None)
async def tags(store: StoreDep, backends: RouterDep) -> dict:
    def listing() -> list[dict]:
        return [view.tag_entry(m, listing_details(store, m.name)) for m in store.list_models()]
    remote = [view.remote_tag_entry(m) for m in await backends.remote_models()]
    return {"models": await asyncio.to_thread(listing) + remote}


@router.post("/api/show", responses={200: {"model": wire.ShowResponse}, **wire.errors(400, 404)},
             response_model=None)
async def show(body: ShowRequest, store: StoreDep, backends: RouterDep, who: CallerDep) -> dict:
    check_model(who, body.model)
    for remote in await backends.remote_models():
        if remote.name == body.model:
            return view.remote_show_body(remote)
    details = await asyncio.to_thread(local_details, store, body.model, verbose=body.verbose)
    return view.show_body(details)


@router.get("/api/ps", responses={200: {"model": wire.ProcessResponse}, **wire.errors()}, response_model=None)
async def ps(backends: RouterDep, store: StoreDep) -> dict:
    loaded = await backends.loaded_models()

    def details(name: str):
        try:
            return listing_details(store, resolve_local(store, name))
        except ModelNotFound:  # a remote backend's model need not be in the local store
            return None
    entries = [view.ps_entry(m, await asyncio.to_thread(details, m.name)) for m in loaded]
    return {"models": entries, "failures": [view.failure_entry(f) for f in backends.runner_failures()]}


@router.post("/api/pull", responses=wire.progress_responses(401, 404, 502, 507))
async def pull(body: PullRequest, store: StoreDep, settings: SettingsDep) -> Response:
    return await _progress(pull_job(store, settings, body.model, body.insecure), body.stream)


@router.post("/api/push", responses=wire.progress_responses(401, 404, 502))
async def push(body: PullRequest, store: StoreDep, settings: SettingsDep) -> Response:
    return await _progress(push_job(store, settings, body.model, body.insecure), body.stream)


@router.post("/api/create", responses=wire.progress_responses(404, 507))
async def create(body: CreateRequest, store: StoreDep) -> Response:
    return await _progress(create_job(store, body), body.stream)


async def _progress(job: Job, stream: bool | None) -> Response:
    if stream is False:
        await run_quietly(job)
        return JSONResponse({"status": "success"})
    return ndjson_response(progress_stream(job))


@router.delete("/api/delete", response_class=Response, responses=wire.empty("deleted", 404))
async def delete(body: ModelRequest, store: StoreDep, backends: RouterDep) -> Response:
    name = resolve_local(store, body.model)
    await backends.unload(body.model)
    await asyncio.to_thread(store.remove, name)
    return Response(status_code=200)


@router.post("/api/copy", response_class=Response, responses=wire.empty("copied", 404))
async def copy(body: CopyRequest, store: StoreDep) -> Response:
    await asyncio.to_thread(copy_model, store, body.source, body.destination)
    return Response(status_code=200)


@router.head("/api/blobs/{digest}", response_class=Response, responses=wire.blob_exists_responses())
async def blob_exists(digest: str, store: StoreDep) -> Response:
    return Response(status_code=200 if store.has_blob(parse_digest(digest)) else 404)


@router.post("/api/blobs/{digest}", response_class=Response, responses=wire.blob_upload_responses())
async def blob_upload(digest: str, request: Request, store: StoreDep, settings: SettingsDep) -> Response:
    created = await receive_blob(store, digest, request, settings.max_blob_bytes)
    return Response(status_code=201 if created else 200)
