"""Manifests: looking one up across host dirs, serving it, and validating a pushed one."""

from __future__ import annotations

from fastapi import Request, Response

from ..errors import RegistryError
from ..manifest import MANIFEST_MEDIA_TYPE, Manifest, digest_bytes
from ..names import DEFAULT_HOST, ModelName, parse_name
from ..store import Store
from .common import OCIError, safe_host

MAX_MANIFEST = 4 << 20


def candidate_hosts(store: Store, request_host: str) -> list[str]:
    """Host dirs to look a manifest up in: the request's host, the default one, then the rest."""
    others = sorted(p.name for p in store.manifests_dir.iterdir()) if store.manifests_dir.is_dir() else []
    ordered = [request_host, DEFAULT_HOST, *others]
    return list(dict.fromkeys(ordered))


def find_manifest(store: Store, request: Request, namespace: str, model: str, tag: str) -> bytes:
    for host in candidate_hosts(store, safe_host(request.headers.get("host"))):
        try:
            path = store.manifest_path(parse_name(f"{host}/{namespace}/{model}:{tag}"))
        except RegistryError:
            continue  # a stray directory that is not a valid host
        if path.is_file():
            return path.read_bytes()
    raise OCIError(404, "MANIFEST_UNKNOWN", f"manifest unknown: {namespace}/{model}:{tag}")


def manifest_response(raw: bytes) -> Response:
    """The stored bytes unchanged (uvicorn drops the body of a HEAD, keeping Content-Length)."""
    return Response(raw, media_type=MANIFEST_MEDIA_TYPE, headers={"Docker-Content-Digest": digest_bytes(raw)})


async def read_manifest_body(request: Request) -> bytes:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_MANIFEST:
            raise OCIError(400, "MANIFEST_INVALID", f"manifest larger than {MAX_MANIFEST} bytes")
    return bytes(raw)


def store_manifest(store: Store, name: ModelName, raw: bytes) -> None:
    try:
        manifest = Manifest.parse(raw)
    except (RegistryError, ValueError) as exc:
        raise OCIError(400, "MANIFEST_INVALID", str(exc)) from None
    missing = [lay.digest for lay in manifest.all_layers() if not store.has_blob(lay.digest)]
    if missing:
        raise OCIError(400, "MANIFEST_BLOB_UNKNOWN", f"manifest references unknown blob {missing[0]}")
    store.write_manifest(name, raw)
