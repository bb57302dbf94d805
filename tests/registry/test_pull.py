"""Pulls against real loopback servers: our registry server, a cutting proxy, a redirector."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import RedirectResponse
from starlette.routing import Route

from fakes.live import free_port
from registry.client import RegistryClient
from registry.download import DownloadOptions
from registry.errors import DigestMismatch, ModelNotFound, RegistryError, RegistryUnreachable
from registry.manifest import CONFIG_MEDIA_TYPE, MEDIA_MODEL, MEDIA_PARAMS, Layer, Manifest
from registry.names import parse_name
from registry.pull import pull_model
from registry.server import RegistryServerThread
from registry.store import Store

from .cutproxy import CutProxy

BLOB_SIZE = 3 << 20
FAST = DownloadOptions(backoff=0.0, part_size=1 << 20)


def publish(store: Store, name: str, payload: bytes) -> bytes:
    model = store.add_blob_bytes(payload)
    params = b'{"stop":["<|im_end|>"]}'
    params_digest = store.add_blob_bytes(params)
    config = b'{"model_format":"gguf","model_family":"qwen2"}\n'
    config_digest = store.add_blob_bytes(config)
    manifest = Manifest(config=Layer(mediaType=CONFIG_MEDIA_TYPE, digest=config_digest, size=len(config)),
                        layers=[Layer(mediaType=MEDIA_MODEL, digest=model, size=len(payload)),
                                Layer(mediaType=MEDIA_PARAMS, digest=params_digest, size=len(params))])
    raw = manifest.to_bytes()
    store.write_manifest(parse_name(name), raw)
    return raw


@pytest.fixture
def served(tmp_path):
    store = Store(tmp_path / "server")
    payload = os.urandom(BLOB_SIZE)
    raw = publish(store, "tiny:latest", payload)
    with RegistryServerThread(store) as server:
        yield server, raw, payload


def pull(store: Store, name: str, opts: DownloadOptions = FAST, events: list | None = None):
    async def go():
        async with RegistryClient() as client:
            return await pull_model(store, parse_name(name, insecure=True), client,
                                    (events.append if events is not None else lambda e: None), opts)
    return asyncio.run(go())


def blob_files(store: Store) -> list[str]:
    return sorted(p.name for p in store.blobs_dir.iterdir()) if store.blobs_dir.exists() else []


def test_pull_writes_identical_manifest_and_blobs(served, tmp_path):
    server, raw, payload = served
    local = Store(tmp_path / "local")
    events: list = []
    pull(local, f"127.0.0.1:{server.port}/library/tiny", events=events)
    name = parse_name(f"127.0.0.1:{server.port}/library/tiny")
    assert local.read_manifest_bytes(name) == raw
    digest = "sha256:" + hashlib.sha256(payload).hexdigest()
    assert local.blob_path(digest).read_bytes() == payload
    statuses = [e.status for e in events]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    finals = [e for e in events if e.digest == digest and e.completed == BLOB_SIZE]
    assert finals and finals[-1].status == f"pulling {digest[7:19]}" and finals[-1].total == BLOB_SIZE
    assert not [f for f in blob_files(local) if "partial" in f]


def test_second_pull_skips_present_blobs(served, tmp_path):
    server, _, _ = served
    local = Store(tmp_path / "local")
    name = f"127.0.0.1:{server.port}/library/tiny"
    pull(local, name)
    with CutProxy(server.port, cut_after=0, cuts=0) as proxy:
        pull(local, f"{proxy.url}/library/tiny")
        assert proxy.blob_requests == 0
    fresh = Store(tmp_path / "fresh")
    with CutProxy(server.port, cut_after=0, cuts=0) as proxy:
        pull(fresh, f"{proxy.url}/library/tiny")
        assert proxy.blob_requests == 3 + 2  # three 1 MiB parts of the model, params, config


def test_connection_cut_mid_blob_is_resumed_within_the_pull(served, tmp_path):
    server, raw, payload = served
    local = Store(tmp_path / "local")
    with CutProxy(server.port, cut_after=300_000, cuts=3) as proxy:
        pull(local, f"{proxy.url}/library/tiny", DownloadOptions(backoff=0.0, part_size=BLOB_SIZE))
        refetched = proxy.blob_bytes - BLOB_SIZE
        assert proxy.blob_requests == 3 + 1 + 2 and proxy.cuts == 0  # 3 cut, 1 resumed, params, config
    assert local.blob_path("sha256:" + hashlib.sha256(payload).hexdigest()).read_bytes() == payload
    assert refetched < 4 * 1024, "resumed requests must only fetch what is missing (+ headers)"


def test_interrupted_pull_resumes_in_a_later_pull(served, tmp_path):
    server, raw, payload = served
    local = Store(tmp_path / "local")
    one_part = DownloadOptions(backoff=0.0, part_size=BLOB_SIZE, max_retries=1)
    with CutProxy(server.port, cut_after=1_000_000, cuts=99) as proxy:
        with pytest.raises(RegistryUnreachable, match="run the pull again to resume"):
            pull(local, f"{proxy.url}/library/tiny", one_part)
    name = parse_name(f"127.0.0.1:{proxy.port}/library/tiny")
    assert not local.manifest_path(name).exists()
    assert any(f.endswith("-partial") for f in blob_files(local))
    with CutProxy(server.port, cut_after=0, cuts=0) as resume:
        pull(local, f"{resume.url}/library/tiny", one_part)
        fetched = resume.blob_bytes
    assert fetched < BLOB_SIZE - 1_500_000, f"resume re-fetched {fetched} bytes"
    assert local.blob_path("sha256:" + hashlib.sha256(payload).hexdigest()).read_bytes() == payload
    assert not [f for f in blob_files(local) if "partial" in f]


def test_corrupted_blob_is_rejected_and_leaves_nothing(served, tmp_path):
    server, raw, payload = served
    digest = "sha256:" + hashlib.sha256(payload).hexdigest()
    server.store.blob_path(digest).write_bytes(os.urandom(BLOB_SIZE))
    local = Store(tmp_path / "local")
    with pytest.raises(DigestMismatch, match=f"want {digest}, got sha256:"):
        pull(local, f"127.0.0.1:{server.port}/library/tiny")
    assert not local.has_blob(digest)
    assert not [f for f in blob_files(local) if digest[7:] in f]
    assert local.list_models() == []


def test_missing_model_and_tag_say_not_found(served, tmp_path):
    server, _, _ = served
    with pytest.raises(ModelNotFound, match="model '127.0.0.1:.*/library/nope:latest' not found"):
        pull(Store(tmp_path / "l"), f"127.0.0.1:{server.port}/library/nope")
    with pytest.raises(ModelNotFound, match="check the name and tag"):
        pull(Store(tmp_path / "l"), f"127.0.0.1:{server.port}/library/tiny:9b")


def test_unreachable_registry_says_offline(tmp_path):
    port = free_port()
    with pytest.raises(RegistryUnreachable, match="could not reach registry 127.0.0.1:.*offline"):
        pull(Store(tmp_path / "l"), f"127.0.0.1:{port}/library/tiny")


def test_concurrent_pulls_of_one_model_download_once(served, tmp_path):
    server, raw, payload = served
    local = Store(tmp_path / "local")

    async def both(url):
        async with RegistryClient() as a, RegistryClient() as b:
            name = parse_name(url, insecure=True)
            await asyncio.gather(pull_model(local, name, a, opts=FAST), pull_model(local, name, b, opts=FAST))

    with CutProxy(server.port, cut_after=0, cuts=0) as proxy:
        asyncio.run(both(f"{proxy.url}/library/tiny"))
        assert BLOB_SIZE < proxy.blob_bytes < BLOB_SIZE + 64 * 1024
    assert local.blob_path("sha256:" + hashlib.sha256(payload).hexdigest()).read_bytes() == payload


def test_hostile_manifest_digest_cannot_escape_the_store(served, tmp_path):
    server, raw, _ = served
    evil = raw.replace(raw[raw.index(b"sha256:"):raw.index(b"sha256:") + 71], b"sha256:../../../../evil")
    path = server.store.manifest_path(parse_name(f"127.0.0.1:{server.port}/library/evil"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(evil)
    local = Store(tmp_path / "local")
    with pytest.raises(RegistryError, match="malformed manifest"):
        pull(local, f"127.0.0.1:{server.port}/library/evil")
    assert not (tmp_path / "evil").exists()
    assert blob_files(local) == []


class Redirector:
    """A registry front that 307s every request to another host (as registry.ollama.ai does to its CDN)."""

    def __init__(self, target: str) -> None:
        self.seen: list[tuple[str, str]] = []

        async def redirect(request):
            self.seen.append((request.method, request.headers.get("range", "")))
            return RedirectResponse(f"{target}{request.url.path}", status_code=307)

        app = Starlette(routes=[Route("/{path:path}", redirect, methods=["GET", "HEAD"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(5)


def test_cross_host_redirect_is_captured_and_reused_for_ranged_parts(served, tmp_path):
    server, raw, payload = served
    local = Store(tmp_path / "local")
    with Redirector(f"http://localhost:{server.port}") as front:
        pull(local, f"127.0.0.1:{front.port}/library/tiny")
    assert local.blob_path("sha256:" + hashlib.sha256(payload).hexdigest()).read_bytes() == payload
    assert not [r for r in front.seen if r[1]], "ranged GETs must go to the CDN host, not the registry"


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs, so a pull really runs out of space (needs root; skipped elsewhere)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or os.system(f"mount -t tmpfs -o size=1m tmpfs {mount} 2>/dev/null") != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    os.system(f"umount {mount}")


def test_disk_full_is_one_clear_error_and_leaves_no_blob(served, tiny_disk):
    server, _, payload = served
    local = Store(tiny_disk / "models")
    with pytest.raises(RegistryError, match="not enough disk space .* point INFER_MODELS elsewhere"):
        pull(local, f"127.0.0.1:{server.port}/library/tiny")
    assert [f for f in blob_files(local) if not f.startswith(".")] == []
    assert local.list_models() == []

