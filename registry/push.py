"""Push a local model to a registry: the OCI distribution upload flow, as ``ollama push`` does it.

For each blob (layers, then config): ``HEAD`` it and skip it if the registry has it; else
``POST …/blobs/uploads/`` (a mount when the layer names its source), ``PATCH`` the bytes in
chunks streamed from the file, ``PUT ?digest=``. Then ``PUT`` the manifest's raw bytes, so the
registry's copy has the same model ID.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlencode, urljoin

from .client import RegistryClient, map_http_errors, raise_for_status
from .errors import AuthError, ModelNotFound, RegistryError
from .manifest import MANIFEST_MEDIA_TYPE, Layer, Manifest
from .names import ModelName, parse_name, short_digest
from .progress import ProgressCallback, ProgressEvent, ignore
from .store import Store

UPLOAD_CHUNK = 64 << 20  # bytes per PATCH request
READ_CHUNK = 1 << 20  # bytes per file read (and per progress event)


async def push_model(store: Store, name: ModelName, client: RegistryClient,
                     on_progress: ProgressCallback = ignore) -> None:
    """Upload every blob the registry lacks, then the manifest; events as Ollama's statuses."""
    on_progress(ProgressEvent("retrieving manifest"))
    raw = store.read_manifest_bytes(name)
    for layer in Manifest.parse(raw).all_layers():
        await push_blob(store, name, client, layer, on_progress)
    on_progress(ProgressEvent("pushing manifest"))
    resp = await client.request("PUT", name.manifest_url, headers={"Content-Type": MANIFEST_MEDIA_TYPE}, content=raw)
    raise_for_status(resp, f"push manifest for {name.display}")
    on_progress(ProgressEvent("success"))


async def push_blob(store: Store, name: ModelName, client: RegistryClient, layer: Layer,
                    on_progress: ProgressCallback = ignore) -> None:
    """Upload one blob unless the registry has it (or can mount it); 100 % once it is stored."""
    path = store.blob_path(layer.digest)
    if not path.is_file():
        raise ModelNotFound(f"blob {layer.digest} of '{name.display}' is missing from the local store; "
                            "pull or create the model again")
    size = path.stat().st_size
    status = f"pushing {short_digest(layer.digest)}"

    def report(done: int) -> None:
        on_progress(ProgressEvent(status, layer.digest, size, done))

    if not await _registry_has(client, name, layer):
        location = await _start_upload(client, name, layer)
        if location is not None:
            await _upload(client, location, path, size, layer.digest, report)
    report(size)


async def _upload(client: RegistryClient, location: str, path: Path, size: int, digest: str,
                  report: Callable[[int], None]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset in range(0, size, UPLOAD_CHUNK):
            length = min(UPLOAD_CHUNK, size - offset)
            location = await _patch(client, location, offset, length, _read_chunks(fd, offset, length, report))
    finally:
        os.close(fd)
    separator = "&" if "?" in location else "?"
    resp = await client.request("PUT", f"{location}{separator}{urlencode({'digest': digest})}")
    raise_for_status(resp, f"upload blob {digest}")


async def _registry_has(client: RegistryClient, name: ModelName, layer: Layer) -> bool:
    resp = await client.request("HEAD", name.blob_url(layer.digest))
    if resp.status_code in (404, 405):
        return False
    raise_for_status(resp, f"check blob {layer.digest}")
    return resp.status_code == 200


async def _start_upload(client: RegistryClient, name: ModelName, layer: Layer) -> str | None:
    """The upload URL, or None when the registry mounted the blob from another repository."""
    base = f"{name.base_url}/v2/{name.repository}/blobs/uploads/"
    params = _mount_params(layer)
    resp = await client.request("POST", f"{base}?{urlencode(params)}" if params else base)
    raise_for_status(resp, f"start upload of {layer.digest}")
    if resp.status_code == 201:
        return None
    if "location" not in resp.headers:
        raise RegistryError(f"registry {name.host} started an upload without a Location header")
    return urljoin(name.base_url + "/", resp.headers["location"])


def _mount_params(layer: Layer) -> dict[str, str]:
    if not layer.from_:
        return {}
    try:
        source = parse_name(layer.from_, insecure=True)
    except RegistryError:
        return {}
    return {"mount": layer.digest, "from": source.repository}


async def _patch(client: RegistryClient, location: str, offset: int, length: int,
                 body: AsyncIterator[bytes]) -> str:
    """Stream one chunk; returns the upload URL to use next (the registry may move it)."""
    headers = {**client.auth_headers(location), "Content-Type": "application/octet-stream",
               "Content-Length": str(length), "Content-Range": f"{offset}-{offset + length - 1}"}
    with map_http_errors(location):
        resp = await client.http.request("PATCH", location, headers=headers, content=body)
    if resp.status_code in (401, 403):
        raise AuthError(f"registry refused the upload ({resp.status_code}); check INFER_REGISTRY_AUTH")
    raise_for_status(resp, f"upload chunk at byte {offset}")
    return urljoin(location, resp.headers.get("location", location))


async def _read_chunks(fd: int, offset: int, length: int, report: Callable[[int], None]) -> AsyncIterator[bytes]:
    """File bytes [offset, offset+length) in READ_CHUNK pieces; reports the bytes already sent
    (100 % is reported by the caller once the registry has verified the blob)."""
    end = offset + length
    while offset < end:
        report(offset)
        data = await asyncio.to_thread(os.pread, fd, min(READ_CHUNK, end - offset), offset)
        if not data:
            raise RegistryError("a blob file shrank while it was being pushed")
        yield data
        offset += len(data)
