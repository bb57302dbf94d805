"""Shared registry fixtures: a real registry server on a free loopback port, and fake models.

``registry_server`` yields a running ``RegistryServerThread`` (``.url``, ``.port``, ``.store``,
``.name("library/tiny:latest")`` → the ModelName that points at it); the ``add_model`` fixture is
``make_model(store, ...)``: it puts a small random model (blobs + manifest) into any Store and
returns a ``FakeModel``. Test modules use fixtures only (importing a conftest is fragile).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from registry.manifest import (CONFIG_MEDIA_TYPE, MEDIA_MODEL, MEDIA_PARAMS, MEDIA_TEMPLATE, Layer, Manifest,
                               digest_bytes)
from registry.names import DEFAULT_HOST, ModelName, parse_name
from registry.server import RegistryServerThread
from registry.store import Store

AUTH = "alice:s3cret"


@dataclass(frozen=True)
class FakeModel:
    name: ModelName  # where it sits in the store it was added to
    manifest: bytes  # the raw manifest bytes
    blobs: dict[str, bytes]  # digest -> content, layers then config

    @property
    def digest(self) -> str:
        return digest_bytes(self.manifest)

    @property
    def model_digest(self) -> str:
        return next(iter(self.blobs))


def make_model(store: Store, name: str = "library/tiny:latest", *, host: str = DEFAULT_HOST,
              model_size: int = 64 * 1024) -> FakeModel:
    """A fake model: random "weights", a template, params and a config blob, plus its manifest."""
    parsed = parse_name(f"{host}/{name}", insecure=True)
    contents = [(MEDIA_MODEL, os.urandom(model_size)), (MEDIA_TEMPLATE, b"{{ .Prompt }}"),
                (MEDIA_PARAMS, b'{"stop":["<|end|>"]}\n')]
    layers = [Layer(media_type=kind, digest=store.add_blob_bytes(data), size=len(data)) for kind, data in contents]
    config_data = b'{"model_format":"gguf","model_family":"fake"}\n'
    config = Layer(media_type=CONFIG_MEDIA_TYPE, digest=store.add_blob_bytes(config_data), size=len(config_data))
    raw = Manifest(config=config, layers=layers).to_bytes()
    store.write_manifest(parsed, raw)
    blobs = {layer.digest: data for layer, (_, data) in zip(layers, contents)}
    blobs[config.digest] = config_data
    return FakeModel(parsed, raw, blobs)


@pytest.fixture
def registry_store(tmp_path: Path) -> Store:
    return Store(tmp_path / "registry-store")


@pytest.fixture
def registry_server(registry_store: Store) -> Iterator[RegistryServerThread]:
    with RegistryServerThread(registry_store) as server:
        yield server


@pytest.fixture
def auth_registry_server(registry_store: Store) -> Iterator[RegistryServerThread]:
    """Like ``registry_server`` but requiring tokens bought with ``.auth`` (user:password)."""
    with RegistryServerThread(registry_store, auth=AUTH) as server:
        yield server


@pytest.fixture
def add_model() -> Callable[..., FakeModel]:
    """``add_model(store, "library/tiny:latest", host=..., model_size=...) -> FakeModel``."""
    return make_model


@pytest.fixture
def served_model(registry_server: RegistryServerThread) -> FakeModel:
    """A fake model ``library/tiny:latest`` in the running server's store (under registry.ollama.ai)."""
    return make_model(registry_server.store)
