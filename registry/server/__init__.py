"""A registry server: serves a Store over the Ollama / OCI distribution protocol.

Pull: ``GET/HEAD /v2/<ns>/<model>/manifests/<tag>`` returns the stored manifest bytes unchanged;
``GET/HEAD /v2/<ns>/<model>/blobs/<digest>`` streams a complete blob (single byte ranges too).
Push: ``POST …/blobs/uploads/`` → ``PATCH`` chunks → ``PUT ?digest=`` → ``PUT …/manifests/<tag>``.
Optional auth: a Basic ``user:password`` at ``/token`` buys a scoped, expiring, HMAC-signed
bearer token (the Docker token flow that ``RegistryClient`` speaks).

Everything from the URL goes through ``registry.names`` before it touches the disk, and
blobs are served only by their exact ``sha256:<64 hex>`` file name, so no request can read
outside the store or see a half-written file.

Modules: ``common`` (errors, URL validation), ``auth`` (tokens), ``manifests``, ``blobs``,
``uploads``, ``app`` (the routes) and ``run`` (serving it).
"""

from __future__ import annotations

import time  # noqa: F401  -- kept as ``registry.server.time``: tests patch ``registry.server.time.time``

from .app import API_VERSION_HEADER, ApiVersionHeader, create_registry_app
from .auth import SERVICE, TOKEN_TTL, TokenAuthority, authorize, guard
from .blobs import BlobResponse, blob_response, open_blob, parse_range
from .common import CHUNK, LOOSEST_HOST, OCIError, check_digest, repo_name, safe_host
from .manifests import (MAX_MANIFEST, candidate_hosts, find_manifest, manifest_response, read_manifest_body,
                        store_manifest)
from .run import RegistryServerThread, serve_registry
from .uploads import (Upload, check_content_range, commit_upload, finish_upload, get_upload, receive_into,
                      upload_headers)

__all__ = [
    "API_VERSION_HEADER", "CHUNK", "LOOSEST_HOST", "MAX_MANIFEST", "SERVICE", "TOKEN_TTL",
    "ApiVersionHeader", "BlobResponse", "OCIError", "RegistryServerThread", "TokenAuthority", "Upload",
    "authorize", "blob_response", "candidate_hosts", "check_content_range", "check_digest", "commit_upload",
    "create_registry_app", "find_manifest", "finish_upload", "get_upload", "guard", "manifest_response",
    "open_blob", "parse_range", "read_manifest_body", "receive_into", "repo_name", "safe_host",
    "serve_registry", "store_manifest", "upload_headers",
]
