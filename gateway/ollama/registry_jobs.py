"""Registry work behind /api/pull, /api/push, /api/create and /api/blobs, with progress as NDJSON.

``progress_stream(job)`` runs ``job(emit)`` as a task and yields each :class:`ProgressEvent` as its
wire dict; ``emit`` is safe to call from worker threads. A failure after the first line becomes the
stream's last line (``{"error": ...}``, see ``gateway.http.streaming``); a client that goes away cancels
the job (a cancelled pull resumes on the next request).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request

from core.options import check_parameters
from registry.client import RegistryClient
from registry.create import create_model
from registry.modelfile import PARAMETER_TYPES, ROLES, Modelfile, parse_parameter
from registry.names import ModelName, parse_digest, parse_name
from registry.progress import ProgressCallback, ProgressEvent, ignore
from registry.pull import pull_model
from registry.push import push_model
from registry.store import Store

from gateway.http.errors import APIError
from gateway.ollama.local import resolve_local
from gateway.ollama.schemas import CreateRequest
from core.settings import ServerSettings

Job = Callable[[ProgressCallback], Awaitable[Any]]
_END = object()


async def progress_stream(job: Job) -> AsyncIterator[dict]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def emit(event: ProgressEvent) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, event)

    task = asyncio.ensure_future(job(emit))
    task.add_done_callback(lambda _: loop.call_soon_threadsafe(queue.put_nowait, _END))
    try:
        while (event := await queue.get()) is not _END:
            yield event.wire()
        task.result()  # re-raises the job's error: the stream ends with an error line
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


async def run_quietly(job: Job) -> None:
    await job(ignore)


# -- pull / push ----------------------------------------------------------------------------------

def pull_job(store: Store, settings: ServerSettings, model: str, insecure: bool) -> Job:
    name = parse_name(model, insecure=insecure or settings.registry.insecure)

    async def job(emit: ProgressCallback) -> None:
        async with RegistryClient(basic_auth=settings.registry.registry_auth) as client:
            await pull_model(store, name, client, emit)
    return job


def push_job(store: Store, settings: ServerSettings, model: str, insecure: bool) -> Job:
    scheme = parse_name(model, insecure=insecure or settings.registry.insecure).scheme
    local = resolve_local(store, model)
    name = local.with_host(local.host, scheme=scheme)

    async def job(emit: ProgressCallback) -> None:
        async with RegistryClient(basic_auth=settings.registry.registry_auth) as client:
            await push_model(store, name, client, emit)
    return job


# -- create ---------------------------------------------------------------------------------------

def create_job(store: Store, body: CreateRequest) -> Job:
    """Validate an /api/create body now (400s before any output), build the model when run."""
    name = parse_name(body.model)
    modelfile = create_modelfile(store, body)

    async def job(emit: ProgressCallback) -> None:
        with tempfile.TemporaryDirectory(prefix="infer-create-") as empty:  # no relative paths resolve
            await asyncio.to_thread(create_model, store, name, modelfile, Path(empty), emit)
    return job


def create_modelfile(store: Store, body: CreateRequest) -> Modelfile:
    if body.quantize:
        raise APIError(400, "quantize is not supported yet; create from an already quantized GGUF",
                       param="quantize")
    if body.adapters:
        raise APIError(400, "adapters are not supported yet; merge the adapter into the GGUF first",
                       param="adapters")
    licenses = [body.license] if isinstance(body.license, str) else list(body.license or [])
    messages = []
    for m in body.messages or []:
        if m.role.lower() not in ROLES:
            raise APIError(400, f"invalid message role {m.role!r}: use one of {', '.join(ROLES)}",
                           param="messages")
        messages.append({"role": m.role.lower(), "content": m.content})
    parameters = _parameters(body.parameters or {})
    try:
        check_parameters(parameters)
    except ValueError as exc:
        name = str(exc).split("'")[1] if "'" in str(exc) else ""
        raise APIError(400, str(exc), param=f"parameters.{name}" if name else "parameters") from None
    return Modelfile(from_=_weights_source(store, body), parameters=parameters,
                     template=body.template, system=body.system, licenses=licenses, messages=messages)


def _weights_source(store: Store, body: CreateRequest) -> str:
    if body.from_:  # a local model's name, never a path on the server
        return resolve_local(store, body.from_).full
    if not body.files:
        raise APIError(400, "neither 'from' nor 'files' was specified", param="from")
    if len(body.files) != 1:
        raise APIError(400, "only a single GGUF file is supported in 'files'", param="files")
    filename, digest = next(iter(body.files.items()))
    digest = parse_digest(digest)
    if not store.has_blob(digest):
        raise APIError(400, f"blob {digest} for {filename!r} not found; upload it first with "
                       f"POST /api/blobs/{digest}", param="files")
    return str(store.blob_path(digest))


def _parameters(params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key not in PARAMETER_TYPES:
            raise APIError(400, f"unknown parameter {key!r}", param=f"parameters.{key}")
        if key == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise APIError(400, "parameter 'stop' must be a string or a list of strings", param="parameters.stop")
            out["stop"] = list(stops)
        elif value is not None:
            raw = str(value).lower() if isinstance(value, bool) else str(value)
            out.update(parse_parameter(key, raw))
    return out


# -- blobs ----------------------------------------------------------------------------------------

async def receive_blob(store: Store, digest: str, request: Request, max_bytes: int) -> bool:
    """Store the request body as blob ``digest``; False if it was already there. 400 on a mismatch;
    413 past ``max_bytes`` or past the store's free disk space (less a reserve), checked as it arrives."""
    digest = parse_digest(digest)
    if store.has_blob(digest):
        return False
    limit = min(max_bytes, _free_bytes(store) - DISK_RESERVE)
    declared = int(request.headers.get("content-length") or 0)
    if declared > limit:
        raise APIError(413, _too_big(declared, max_bytes, limit))
    tmp = store.new_temp_blob()
    sha = hashlib.sha256()
    seen = 0
    try:
        with open(tmp, "wb") as fh:
            async for chunk in request.stream():
                seen += len(chunk)
                if seen > limit:
                    raise APIError(413, _too_big(seen, max_bytes, limit))
                sha.update(chunk)
                fh.write(chunk)
        got = "sha256:" + sha.hexdigest()
        if got != digest:
            raise APIError(400, f"digest mismatch: expected {digest}, got {got}")
        await asyncio.to_thread(_commit, store, tmp, digest)
    finally:
        tmp.unlink(missing_ok=True)
    return True


DISK_RESERVE = 1 << 30  # keep a GiB free for the ledger and everything else


def _free_bytes(store: Store) -> int:
    store.blobs_dir.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(store.blobs_dir).free


def _too_big(size: int, max_bytes: int, limit: int) -> str:
    if limit < max_bytes:
        return f"blob too large: {size} bytes, and only {max(0, limit)} bytes can be stored (disk space)"
    return f"blob too large: {size} bytes (limit {max_bytes} bytes, INFER_MAX_BLOB_BYTES)"


def _commit(store: Store, tmp: Path, digest: str) -> None:
    with store.blob_lock(digest):
        if not store.has_blob(digest):
            store.commit_blob(tmp, digest, actual=digest)


def copy_model(store: Store, source: str, destination: str) -> ModelName:
    src = resolve_local(store, source)
    dst = parse_name(destination)
    store.copy(src, dst)
    return dst
