"""The registry server over real loopback HTTP: pull routes, byte ranges, path safety, push, auth."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import pytest

from fakes.live import free_port
from registry import push
from registry.client import RegistryClient, raise_for_status
from registry.errors import AuthError, ModelNotFound, RegistryHTTPError
from registry.manifest import MANIFEST_MEDIA_TYPE, digest_bytes
from registry.names import ModelName
from registry.progress import ProgressCallback, ProgressEvent
from registry.push import push_model
from registry.server import OCIError, RegistryServerThread, TokenAuthority, parse_range
from registry.store import Store

if TYPE_CHECKING:
    from .conftest import FakeModel

T = TypeVar("T")
AddModel = Callable[..., "FakeModel"]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def raw_get(server: RegistryServerThread, path: str, method: str = "GET") -> tuple[int, bytes]:
    """Send the path exactly as written (httpx would normalise ``..``)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=5)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def error_code(resp: httpx.Response) -> str:
    return str(resp.json()["errors"][0]["code"])


def store_files(store: Store) -> list[str]:
    """Every file in the store (relative paths), lock files excluded: to spot leftovers."""
    return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*")
                  if p.is_file() and store.locks_dir not in p.parents)


async def _push(store: Store, name: ModelName, on_progress: ProgressCallback, auth: str | None = None) -> None:
    async with RegistryClient(basic_auth=auth) as client:
        await push_model(store, name, client, on_progress)


async def _get_manifest(name: ModelName, auth: str | None) -> bytes:
    async with RegistryClient(basic_auth=auth) as client:
        return await client.get_manifest(name)


# -- pull routes ---------------------------------------------------------------------------------
def test_base_endpoint(registry_server: RegistryServerThread) -> None:
    resp = httpx.get(f"{registry_server.url}/v2/")
    assert resp.status_code == 200
    assert resp.json() == {}
    assert resp.headers["docker-distribution-api-version"] == "registry/2.0"


def test_manifest_get_and_head(registry_server: RegistryServerThread, served_model: "FakeModel") -> None:
    url = f"{registry_server.url}/v2/library/tiny/manifests/latest"
    resp = httpx.get(url)
    assert resp.status_code == 200
    assert resp.content == served_model.manifest
    assert resp.headers["docker-content-digest"] == served_model.digest
    assert resp.headers["content-type"] == MANIFEST_MEDIA_TYPE
    assert resp.headers["content-length"] == str(len(served_model.manifest))
    head = httpx.head(url)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(served_model.manifest))
    assert head.headers["docker-content-digest"] == served_model.digest


def test_manifest_lookup_prefers_request_host(registry_server: RegistryServerThread, add_model: AddModel) -> None:
    store = registry_server.store
    other = add_model(store, host="other.example")
    assert httpx.get(f"{registry_server.url}/v2/library/tiny/manifests/latest").content == other.manifest
    default = add_model(store)
    assert httpx.get(f"{registry_server.url}/v2/library/tiny/manifests/latest").content == default.manifest
    mine = add_model(store, host=f"127.0.0.1:{registry_server.port}")
    assert httpx.get(f"{registry_server.url}/v2/library/tiny/manifests/latest").content == mine.manifest


def test_manifest_unknown(registry_server: RegistryServerThread) -> None:
    resp = httpx.get(f"{registry_server.url}/v2/library/nothing/manifests/latest")
    assert resp.status_code == 404
    message = "manifest unknown: library/nothing:latest"
    assert resp.json() == {"errors": [{"code": "MANIFEST_UNKNOWN", "message": message, "detail": None}]}


def test_unknown_route_is_404(registry_server: RegistryServerThread) -> None:
    assert httpx.get(f"{registry_server.url}/v2/library/tiny/tags/list").status_code == 404
    assert httpx.get(f"{registry_server.url}/nope").status_code == 404


def test_blob_full(registry_server: RegistryServerThread, served_model: "FakeModel") -> None:
    digest = served_model.model_digest
    resp = httpx.get(f"{registry_server.url}/v2/library/tiny/blobs/{digest}")
    assert resp.status_code == 200
    assert resp.content == served_model.blobs[digest]
    assert resp.headers["content-length"] == str(len(served_model.blobs[digest]))
    assert resp.headers["accept-ranges"] == "bytes"
    assert resp.headers["docker-content-digest"] == digest
    assert resp.headers["content-type"] == "application/octet-stream"
    head = httpx.head(f"{registry_server.url}/v2/library/tiny/blobs/{digest}")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(served_model.blobs[digest]))


def test_blob_larger_than_a_chunk(registry_server: RegistryServerThread) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    digest = registry_server.store.add_blob_bytes(data)
    resp = httpx.get(f"{registry_server.url}/v2/library/any/blobs/{digest}")
    assert hashlib.sha256(resp.content).hexdigest() == digest[7:]


@pytest.mark.parametrize(("header", "start", "end"), [
    ("bytes=0-9", 0, 9), ("bytes=10-", 10, 65535), ("bytes=-5", 65531, 65535),
    ("bytes=100-999999", 100, 65535), ("bytes=-999999", 0, 65535), ("bytes=65535-65535", 65535, 65535),
])
def test_blob_range(registry_server: RegistryServerThread, served_model: "FakeModel", header: str, start: int,
                    end: int) -> None:
    digest = served_model.model_digest
    resp = httpx.get(f"{registry_server.url}/v2/library/tiny/blobs/{digest}", headers={"Range": header})
    assert resp.status_code == 206
    assert resp.content == served_model.blobs[digest][start:end + 1]
    assert resp.headers["content-length"] == str(end - start + 1)
    assert resp.headers["content-range"] == f"bytes {start}-{end}/65536"


@pytest.mark.parametrize("header", ["bytes=65536-", "bytes=70000-70010", "bytes=-0"])
def test_blob_range_unsatisfiable(registry_server: RegistryServerThread, served_model: "FakeModel",
                                  header: str) -> None:
    url = f"{registry_server.url}/v2/library/tiny/blobs/{served_model.model_digest}"
    resp = httpx.get(url, headers={"Range": header})
    assert resp.status_code == 416
    assert resp.headers["content-range"] == "bytes */65536"


@pytest.mark.parametrize("header", ["bytes=0-1,5-6", "bytes=9-3", "items=0-5", "bytes=abc"])
def test_blob_odd_range_serves_everything(registry_server: RegistryServerThread, served_model: "FakeModel",
                                          header: str) -> None:
    url = f"{registry_server.url}/v2/library/tiny/blobs/{served_model.model_digest}"
    resp = httpx.get(url, headers={"Range": header})
    assert resp.status_code == 200 and len(resp.content) == 65536


def test_parse_range_edges() -> None:
    assert parse_range(None, 10) is None
    assert parse_range("bytes=-3", 2) == (0, 1)
    with pytest.raises(OCIError):
        parse_range("bytes=0-", 0)  # nothing is satisfiable in an empty blob


def test_blob_unknown(registry_server: RegistryServerThread) -> None:
    resp = httpx.get(f"{registry_server.url}/v2/library/tiny/blobs/sha256:{'0' * 64}")
    assert resp.status_code == 404 and error_code(resp) == "BLOB_UNKNOWN"


# -- path safety ---------------------------------------------------------------------------------
@pytest.fixture
def secret(tmp_path: Path, registry_server: RegistryServerThread) -> bytes:
    """A file outside the store shaped so that a traversal would find it."""
    value = b"TOP-SECRET-" + os.urandom(8).hex().encode()
    for rel in ("manifests/x", "etc/manifests/x", "secret", "registry.ollama.ai/library/foo/latest"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(value)
    return value


@pytest.mark.parametrize("path", [
    "/v2/../../etc/manifests/x",
    "/v2/library/%2e%2e/manifests/latest",
    "/v2/%2e%2e/%2e%2e/manifests/x",
    "/v2/library/..%2f..%2f..%2f/manifests/secret",
    "/v2/library/foo/manifests/..%2f..%2f..%2fsecret",
    "/v2/library/foo/manifests/%2e%2e",
    "/v2/.hidden/foo/manifests/latest",
    "/v2/library/foo/blobs/sha256:../../secret",
    "/v2/library/foo/blobs/sha256:%2e%2e%2f%2e%2e%2fsecret",
    "/v2/library/foo/blobs/..%2f..%2fsecret",
])
def test_path_traversal_rejected(registry_server: RegistryServerThread, secret: bytes, path: str) -> None:
    for method in ("GET", "HEAD"):
        status, body = raw_get(registry_server, path, method)
        assert status in (400, 404), path
        assert secret not in body


@pytest.mark.parametrize("digest", [
    "sha256:" + "A" * 64, "sha256:" + "a" * 63, "sha256:" + "a" * 65, "sha256-" + "a" * 64, "sha512:" + "a" * 64,
    "sha256:" + "a" * 64 + "-partial",
])
def test_bad_digests_rejected(registry_server: RegistryServerThread, digest: str) -> None:
    resp = httpx.get(f"{registry_server.url}/v2/library/tiny/blobs/{digest}")
    assert resp.status_code == 400 and error_code(resp) == "DIGEST_INVALID"


def test_partial_blob_never_served(registry_server: RegistryServerThread) -> None:
    data = os.urandom(100)
    digest = digest_bytes(data)
    blobs = registry_server.store.blobs_dir
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / f"{digest.replace(':', '-')}-partial").write_bytes(data)
    assert httpx.get(f"{registry_server.url}/v2/library/tiny/blobs/{digest}").status_code == 404


# -- push --------------------------------------------------------------------------------------------
def test_push_roundtrip(tmp_path: Path, registry_server: RegistryServerThread, add_model: AddModel) -> None:
    local = Store(tmp_path / "local")
    target = registry_server.name("library/tiny:latest")
    model = add_model(local, host=target.host)
    events: list[ProgressEvent] = []
    run(_push(local, target, events.append))

    remote = registry_server.store
    assert remote.read_manifest_bytes(target) == model.manifest
    for digest, data in model.blobs.items():
        assert remote.blob_path(digest).read_bytes() == data
    statuses = [e.status for e in events]
    assert statuses[0] == "retrieving manifest" and statuses[-2:] == ["pushing manifest", "success"]
    finals = [e for e in events if e.digest and e.completed == e.total]
    assert [e.digest for e in finals] == list(model.blobs)
    assert all(e.status == f"pushing {e.digest[7:19]}" for e in finals)
    assert store_files(remote) == sorted([f"blobs/{d.replace(':', '-')}" for d in model.blobs]
                                         + [f"manifests/{target.host}/library/tiny/latest"])
    # pulled back through the server: same bytes, same model ID
    resp = httpx.get(f"{registry_server.url}/v2/library/tiny/manifests/latest")
    assert resp.headers["docker-content-digest"] == model.digest


def test_push_again_skips_existing_blobs(tmp_path: Path, registry_server: RegistryServerThread,
                                         add_model: AddModel) -> None:
    local = Store(tmp_path / "local")
    target = registry_server.name("library/tiny:v2")
    model = add_model(local, "library/tiny:v2", host=target.host)
    run(_push(local, target, lambda e: None))
    events: list[ProgressEvent] = []
    run(_push(local, target, events.append))
    blob_events = [e for e in events if e.digest]
    assert [e.digest for e in blob_events] == list(model.blobs)
    assert all(e.completed == e.total for e in blob_events)


def test_push_in_many_chunks(tmp_path: Path, registry_server: RegistryServerThread,
                             monkeypatch: pytest.MonkeyPatch, add_model: AddModel) -> None:
    monkeypatch.setattr(push, "UPLOAD_CHUNK", 10_000)
    monkeypatch.setattr(push, "READ_CHUNK", 4_000)
    local = Store(tmp_path / "local")
    target = registry_server.name("library/chunky:latest")
    model = add_model(local, "library/chunky:latest", host=target.host, model_size=45_000)
    events: list[ProgressEvent] = []
    run(_push(local, target, events.append))
    assert registry_server.store.blob_path(model.model_digest).read_bytes() == model.blobs[model.model_digest]
    done = [e.completed for e in events if e.digest == model.model_digest]
    assert done == sorted(done) and done[-1] == 45_000 and len(done) > 10


def test_push_missing_local_model(tmp_path: Path, registry_server: RegistryServerThread) -> None:
    with pytest.raises(ModelNotFound):
        run(_push(Store(tmp_path / "empty"), registry_server.name("library/ghost:latest"), lambda e: None))


def test_registry_errors_carry_the_registry_message() -> None:
    body = {"errors": [{"code": "DENIED", "message": "quota exceeded", "detail": None}]}
    resp = httpx.Response(403, json=body, request=httpx.Request("PUT", "http://x/"))
    with pytest.raises(RegistryHTTPError, match="DENIED: quota exceeded") as info:
        raise_for_status(resp, "push manifest")
    assert info.value.status_code == 403


# -- upload protocol edges -------------------------------------------------------------------------
def _start(server: RegistryServerThread, **params: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/library/up/blobs/uploads/", params=params)


def test_upload_digest_mismatch_leaves_nothing(registry_server: RegistryServerThread) -> None:
    resp = _start(registry_server)
    assert resp.status_code == 202 and resp.headers["range"] == "0-0"
    location = registry_server.url + resp.headers["location"]
    resp = httpx.patch(location, content=b"hello world", headers={"Content-Range": "0-10"})
    assert resp.status_code == 202 and resp.headers["range"] == "0-10"
    wrong = digest_bytes(b"something else")
    resp = httpx.put(location, params={"digest": wrong})
    assert resp.status_code == 400 and error_code(resp) == "DIGEST_INVALID"
    assert store_files(registry_server.store) == []
    assert httpx.put(location, params={"digest": wrong}).status_code == 404  # the upload is gone


def test_upload_chunks_out_of_order(registry_server: RegistryServerThread) -> None:
    location = registry_server.url + _start(registry_server).headers["location"]
    assert httpx.patch(location, content=b"abc", headers={"Content-Range": "0-2"}).status_code == 202
    resp = httpx.patch(location, content=b"xyz", headers={"Content-Range": "10-12"})
    assert resp.status_code == 416 and resp.headers["range"] == "0-2"
    assert httpx.get(location).headers["range"] == "0-2"
    resp = httpx.put(location, params={"digest": digest_bytes(b"abcdef")}, content=b"def")
    assert resp.status_code == 201
    assert registry_server.store.blob_path(digest_bytes(b"abcdef")).read_bytes() == b"abcdef"


def test_monolithic_upload_and_mount(registry_server: RegistryServerThread) -> None:
    digest = digest_bytes(b"one shot")
    url = f"{registry_server.url}/v2/library/up/blobs/uploads/"
    resp = httpx.post(url, params={"digest": digest}, content=b"one shot")
    assert resp.status_code == 201 and resp.headers["docker-content-digest"] == digest
    resp = _start(registry_server, mount=digest, **{"from": "library/other"})
    assert resp.status_code == 201
    resp = _start(registry_server, mount=digest_bytes(b"absent"))
    assert resp.status_code == 202  # not mountable: a normal upload starts


def test_upload_unknown(registry_server: RegistryServerThread) -> None:
    resp = httpx.patch(f"{registry_server.url}/v2/library/up/blobs/uploads/nope", content=b"x")
    assert resp.status_code == 404 and error_code(resp) == "BLOB_UPLOAD_UNKNOWN"


def test_manifest_put_checks_blobs_and_json(registry_server: RegistryServerThread, tmp_path: Path,
                                            add_model: AddModel) -> None:
    model = add_model(Store(tmp_path / "elsewhere"))  # its blobs are not on the server
    url = f"{registry_server.url}/v2/library/tiny/manifests/latest"
    headers = {"Content-Type": MANIFEST_MEDIA_TYPE}
    resp = httpx.put(url, content=model.manifest, headers=headers)
    assert resp.status_code == 400 and error_code(resp) == "MANIFEST_BLOB_UNKNOWN"
    resp = httpx.put(url, content=b"{not json", headers=headers)
    assert resp.status_code == 400 and error_code(resp) == "MANIFEST_INVALID"
    assert not registry_server.store.manifests_dir.exists()


# -- auth --------------------------------------------------------------------------------------------
def test_auth_challenge(auth_registry_server: RegistryServerThread, registry_store: Store, add_model: AddModel) -> None:
    add_model(registry_store)
    resp = httpx.get(f"{auth_registry_server.url}/v2/library/tiny/manifests/latest")
    assert resp.status_code == 401 and error_code(resp) == "UNAUTHORIZED"
    assert resp.headers["www-authenticate"] == (
        f'Bearer realm="{auth_registry_server.url}/token",service="infer-registry",'
        'scope="repository:library/tiny:pull"')
    resp = httpx.post(f"{auth_registry_server.url}/v2/library/tiny/blobs/uploads/")
    assert resp.headers["www-authenticate"].endswith('scope="repository:library/tiny:pull,push"')


def test_auth_wrong_password(auth_registry_server: RegistryServerThread, registry_store: Store,
                             add_model: AddModel) -> None:
    add_model(registry_store)
    name = auth_registry_server.name("library/tiny:latest")
    assert auth_registry_server.auth == "alice:s3cret"
    for creds in (None, "alice:wrong", "bob:s3cret"):
        with pytest.raises(AuthError):
            run(_get_manifest(name, creds))


def test_auth_pull_and_push_with_token(auth_registry_server: RegistryServerThread, registry_store: Store,
                                       tmp_path: Path, add_model: AddModel) -> None:
    served = add_model(registry_store)
    name = auth_registry_server.name("library/tiny:latest")
    assert run(_get_manifest(name, auth_registry_server.auth)) == served.manifest
    local = Store(tmp_path / "local")
    target = auth_registry_server.name("team/pushed:latest")
    model = add_model(local, "team/pushed:latest", host=target.host)

    run(_push(local, target, lambda e: None, auth_registry_server.auth))
    assert registry_store.read_manifest_bytes(target) == model.manifest


def test_token_is_scoped(auth_registry_server: RegistryServerThread, registry_store: Store,
                         add_model: AddModel) -> None:
    add_model(registry_store)
    add_model(registry_store, "library/other:latest")
    url = auth_registry_server.url
    resp = httpx.get(f"{url}/token", params={"service": "infer-registry", "scope": "repository:library/tiny:pull"},
                     auth=("alice", "s3cret"))
    assert resp.status_code == 200 and resp.json()["expires_in"] == 3600
    bearer = {"Authorization": f"Bearer {resp.json()['token']}"}
    assert httpx.get(f"{url}/v2/library/tiny/manifests/latest", headers=bearer).status_code == 200
    assert httpx.get(f"{url}/v2/library/other/manifests/latest", headers=bearer).status_code == 401
    assert httpx.post(f"{url}/v2/library/tiny/blobs/uploads/", headers=bearer).status_code == 401
    last = bearer["Authorization"][-2]
    forged = {"Authorization": bearer["Authorization"][:-2] + ("B" if last == "A" else "A") + "A"}
    assert httpx.get(f"{url}/v2/library/tiny/manifests/latest", headers=forged).status_code == 401
    assert httpx.get(f"{url}/token", auth=("alice", "nope")).status_code == 401


def test_token_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    authority = TokenAuthority("alice:s3cret")
    token = authority.issue(["repository:library/tiny:pull"])
    header = f"Bearer {token}"
    assert authority.allows(header, "library/tiny", ("pull",))
    assert not authority.allows(header, "library/tiny", ("pull", "push"))
    assert not TokenAuthority("alice:s3cret").allows(header, "library/tiny", ("pull",))  # another server's secret
    real_time = __import__("time").time
    monkeypatch.setattr("registry.server.time.time", lambda: real_time() + 3601)
    assert not authority.allows(header, "library/tiny", ("pull",))


# -- the CLI -------------------------------------------------------------------------------------------
def test_cli_serve_until_interrupted(tmp_path: Path, add_model: AddModel) -> None:
    store = Store(tmp_path / "served")
    model = add_model(store)
    port = free_port()
    cmd = [sys.executable, "-c", "from cli.main import main; main()", "registry", "serve", "--root", str(store.root),
           "--port", str(port)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert select.select([proc.stdout], [], [], 30)[0], "no output from 'infer registry serve'"
            assert proc.stdout and proc.stdout.readline() == f"serving {store.root} at http://127.0.0.1:{port}\n"
            url = f"http://127.0.0.1:{port}/v2/library/tiny/manifests/latest"
            assert _get_when_up(url).content == model.manifest
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) in (0, 130)  # newer uvicorn re-raises SIGINT after a clean shutdown
            assert proc.stderr and "Traceback" not in proc.stderr.read()
        finally:
            proc.kill()


def _get_when_up(url: str) -> httpx.Response:
    deadline = time.monotonic() + 10
    while True:
        try:
            return httpx.get(url)
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
