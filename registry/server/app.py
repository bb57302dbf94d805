"""The FastAPI app: middleware, error handling, and the pull and push routes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..manifest import digest_bytes
from ..store import Store
from .auth import TokenAuthority, authorize, guard, token_response
from .blobs import blob_response
from .common import OCIError, check_digest, log, oci_error_response, safe_host
from .manifests import find_manifest, manifest_response, read_manifest_body, store_manifest
from .uploads import Upload, check_content_range, finish_upload, get_upload, receive_into, upload_headers

API_VERSION_HEADER = (b"docker-distribution-api-version", b"registry/2.0")


class ApiVersionHeader:
    """Adds ``Docker-Distribution-API-Version`` to every response; pure ASGI (unlike
    BaseHTTPMiddleware), so blob bodies pass straight through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), API_VERSION_HEADER]
            await send(message)

        await self.app(scope, receive, send_with_header if scope["type"] == "http" else send)


def create_registry_app(store: Store, *, auth: str | None = None) -> FastAPI:
    """A FastAPI app serving ``store`` as a registry; ``auth="user:password"`` turns on tokens."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        for upload in app.state.uploads.values():
            upload.path.unlink(missing_ok=True)  # abandoned pushes leave nothing behind

    app = FastAPI(title="infer registry", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.auth = TokenAuthority(auth) if auth else None
    app.state.uploads = {}
    app.add_exception_handler(OCIError, oci_error_response)
    app.add_middleware(ApiVersionHeader)
    _add_pull_routes(app, store)
    _add_push_routes(app, store)
    return app


def _add_pull_routes(app: FastAPI, store: Store) -> None:
    @app.api_route("/v2/", methods=["GET", "HEAD"])
    async def base(request: Request) -> Response:
        authorize(request)
        return JSONResponse({})

    @app.get("/token")
    async def token(request: Request) -> Response:
        return token_response(request)

    @app.api_route("/v2/{namespace}/{model}/manifests/{tag}", methods=["GET", "HEAD"])
    async def get_manifest(request: Request, namespace: str, model: str, tag: str) -> Response:
        guard(request, namespace, model, tag)
        raw = await anyio.to_thread.run_sync(find_manifest, store, request, namespace, model, tag)
        return manifest_response(raw)

    @app.api_route("/v2/{namespace}/{model}/blobs/{digest}", methods=["GET", "HEAD"])
    async def get_blob(request: Request, namespace: str, model: str, digest: str) -> Response:
        guard(request, namespace, model)
        return blob_response(store, request, digest)


def _add_push_routes(app: FastAPI, store: Store) -> None:
    @app.post("/v2/{namespace}/{model}/blobs/uploads/")
    @app.post("/v2/{namespace}/{model}/blobs/uploads")
    async def start_upload(request: Request, namespace: str, model: str) -> Response:
        guard(request, namespace, model)
        mount, digest = request.query_params.get("mount"), request.query_params.get("digest")
        if digest is not None:
            check_digest(digest)
        if mount and store.has_blob(check_digest(mount)):
            return Response(status_code=201, headers={"Location": f"/v2/{namespace}/{model}/blobs/{mount}",
                                                      "Docker-Content-Digest": mount})
        upload_id = uuid.uuid4().hex
        upload = Upload(f"{namespace}/{model}", store.new_temp_blob())
        request.app.state.uploads[upload_id] = upload
        if digest is not None:  # monolithic upload
            async with upload.lock:
                await receive_into(upload, request)
                return await finish_upload(store, request, namespace, model, upload_id)
        return Response(status_code=202, headers=upload_headers(namespace, model, upload_id, upload))

    @app.get("/v2/{namespace}/{model}/blobs/uploads/{upload_id}")
    async def upload_status(request: Request, namespace: str, model: str, upload_id: str) -> Response:
        guard(request, namespace, model)
        upload = get_upload(request, namespace, model, upload_id)
        return Response(status_code=204, headers=upload_headers(namespace, model, upload_id, upload))

    @app.patch("/v2/{namespace}/{model}/blobs/uploads/{upload_id}")
    async def patch_upload(request: Request, namespace: str, model: str, upload_id: str) -> Response:
        guard(request, namespace, model)
        upload = get_upload(request, namespace, model, upload_id)
        async with upload.lock:
            check_content_range(request, upload)
            await receive_into(upload, request)
        return Response(status_code=202, headers=upload_headers(namespace, model, upload_id, upload))

    @app.put("/v2/{namespace}/{model}/blobs/uploads/{upload_id}")
    async def put_upload(request: Request, namespace: str, model: str, upload_id: str) -> Response:
        guard(request, namespace, model)
        upload = get_upload(request, namespace, model, upload_id)
        async with upload.lock:
            check_digest(request.query_params.get("digest"))
            await receive_into(upload, request)
            return await finish_upload(store, request, namespace, model, upload_id)

    @app.put("/v2/{namespace}/{model}/manifests/{tag}")
    async def put_manifest(request: Request, namespace: str, model: str, tag: str) -> Response:
        name = guard(request, namespace, model, tag, safe_host(request.headers.get("host")))
        raw = await read_manifest_body(request)
        await anyio.to_thread.run_sync(store_manifest, store, name, raw)
        log.info("stored manifest %s", name.full)
        return Response(status_code=201, headers={"Docker-Content-Digest": digest_bytes(raw),
                                                  "Location": f"/v2/{namespace}/{model}/manifests/{tag}"})
