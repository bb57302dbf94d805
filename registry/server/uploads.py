"""Blob uploads: ``POST …/blobs/uploads/`` → ``PATCH`` chunks → ``PUT ?digest=``, all or nothing."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from fastapi import Request, Response
from starlette.requests import ClientDisconnect

from ..errors import DigestMismatch
from ..store import Store
from .common import CHUNK, OCIError, check_digest, log

_CONTENT_RANGE_RE = re.compile(r"(?:bytes[ =])?(\d+)-(\d+)")


@dataclass
class Upload:
    repository: str
    path: Path
    size: int = 0
    sha: Any = field(default_factory=hashlib.sha256)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def append(self, data: bytes) -> None:
        with open(self.path, "ab") as fh:
            fh.write(data)
        self.sha.update(data)
        self.size += len(data)

    def rollback(self, size: int, sha: Any) -> None:
        os.truncate(self.path, size)
        self.size, self.sha = size, sha


async def receive_into(upload: Upload, request: Request) -> None:
    """Append the request body to the upload, all or nothing (writes batched, off the loop)."""
    size, sha, buf = upload.size, upload.sha.copy(), bytearray()
    try:
        async for chunk in request.stream():
            buf += chunk
            if len(buf) >= CHUNK:
                await anyio.to_thread.run_sync(upload.append, bytes(buf))
                buf.clear()
        await anyio.to_thread.run_sync(upload.append, bytes(buf))
    except BaseException as exc:
        upload.rollback(size, sha)
        if isinstance(exc, ClientDisconnect):
            raise OCIError(400, "BLOB_UPLOAD_INVALID", "client disconnected during the upload") from None
        raise


def commit_upload(store: Store, upload: Upload, digest: str) -> None:
    """Verify and move an upload into the store (blocking: fsync); the temp file never survives."""
    got = "sha256:" + upload.sha.hexdigest()
    try:
        if got != digest:
            raise DigestMismatch(digest, got)
        with store.blob_lock(digest):
            if not store.has_blob(digest):
                store.commit_blob(upload.path, digest, actual=got)
    finally:
        upload.path.unlink(missing_ok=True)  # already moved when committed


def upload_headers(namespace: str, model: str, upload_id: str, upload: Upload) -> dict[str, str]:
    return {"Location": f"/v2/{namespace}/{model}/blobs/uploads/{upload_id}", "Docker-Upload-UUID": upload_id,
            "Range": f"0-{max(upload.size - 1, 0)}"}


def get_upload(request: Request, namespace: str, model: str, upload_id: str) -> Upload:
    upload = request.app.state.uploads.get(upload_id)
    if upload is None or upload.repository != f"{namespace}/{model}":
        raise OCIError(404, "BLOB_UPLOAD_UNKNOWN", f"blob upload unknown: {upload_id}")
    return upload


def check_content_range(request: Request, upload: Upload) -> None:
    header = request.headers.get("content-range")
    if header is None:
        return
    match = _CONTENT_RANGE_RE.fullmatch(header.strip())
    if not match or int(match.group(1)) != upload.size:
        raise OCIError(416, "BLOB_UPLOAD_INVALID", f"chunk {header!r} does not start at byte {upload.size}",
                       {"Range": f"0-{max(upload.size - 1, 0)}"})


async def finish_upload(store: Store, request: Request, namespace: str, model: str, upload_id: str) -> Response:
    digest = check_digest(request.query_params.get("digest"))
    upload = request.app.state.uploads.pop(upload_id, None)
    if upload is None:  # a concurrent PUT finished it first
        raise OCIError(404, "BLOB_UPLOAD_UNKNOWN", f"blob upload unknown: {upload_id}")
    try:
        await anyio.to_thread.run_sync(commit_upload, store, upload, digest)
    except DigestMismatch as exc:
        raise OCIError(400, "DIGEST_INVALID", str(exc)) from None
    log.info("stored blob %s (%d bytes) for %s/%s", digest, upload.size, namespace, model)
    return Response(status_code=201, headers={"Location": f"/v2/{namespace}/{model}/blobs/{digest}",
                                              "Docker-Content-Digest": digest})
