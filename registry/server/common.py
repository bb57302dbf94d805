"""What every route shares: the OCI error type and its JSON response, and URL validation."""

from __future__ import annotations

import logging
import re

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from ..errors import RegistryError
from ..names import DEFAULT_HOST, ModelName, parse_digest, parse_name

log = logging.getLogger(__package__)  # "registry.server", as before the split

CHUNK = 1 << 20  # read size when streaming a blob
_SAFE_HOST_RE = re.compile(r"[^A-Za-z0-9_.:-]")
LOOSEST_HOST = "hf.co"


class OCIError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


async def oci_error_response(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, OCIError)
    body = {"errors": [{"code": exc.code, "message": exc.message, "detail": None}]}
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


# -- names and digests ---------------------------------------------------------------------
def repo_name(namespace: str, model: str, tag: str = "latest", host: str = LOOSEST_HOST) -> ModelName:
    """Validate URL path parts with the model-name grammar (rejects ``..``, slashes, odd chars).

    The default host is the one whose namespace grammar is loosest (``hf.co`` allows dots), so
    any name some host dir could hold passes; lookups then re-check per host dir."""
    try:
        return parse_name(f"{host}/{namespace}/{model}:{tag}")
    except RegistryError:
        raise OCIError(400, "NAME_INVALID", f"invalid repository name or tag {namespace}/{model}:{tag}") from None


def check_digest(digest: str | None) -> str:
    """Exactly ``sha256:<64 lowercase hex>``: the wire form, no aliases (``sha256-…``) or spaces."""
    try:
        if digest is not None and parse_digest(digest) == digest:
            return digest
    except RegistryError:
        pass
    raise OCIError(400, "DIGEST_INVALID", f"invalid digest {digest!r}: expected sha256:<64 lowercase hex>")


def safe_host(host: str | None) -> str:
    """The Host header as a manifests/ directory name, or the default host if it cannot be one."""
    cleaned = _SAFE_HOST_RE.sub("_", (host or "").strip().lower())
    try:
        return parse_name(f"{cleaned}/library/x").host
    except RegistryError:
        return DEFAULT_HOST
