"""What the in-process engines share about the local store: a model's details, the listing, its GGUF."""

from __future__ import annotations

from pathlib import Path

from registry.details import ModelDetails, details_cache
from registry.errors import InvalidName, ModelNotFound as StoreModelNotFound
from registry.store import Store

from core.base import ModelInfo
from core.errors import BackendUnavailable, ModelNotFound


def model_details(store: Store, model: str) -> ModelDetails:
    """The model's manifest, layers and GGUF header; cached until its manifest file changes."""
    try:
        return details_cache.get(store, store.resolve(model))
    except (StoreModelNotFound, InvalidName, FileNotFoundError):
        raise ModelNotFound(model) from None


def store_models(store: Store, backend: str) -> list[ModelInfo]:
    return [ModelInfo(name=m.name.display, backend=backend, size=m.size, digest=m.digest, modified=m.modified,
                      parent=_parent(store, m.name)) for m in store.list_models()]


def _parent(store: Store, name) -> str | None:
    try:
        return details_cache.get(store, name).parent
    except Exception:  # noqa: BLE001 - a listing shows what it can; the model's own requests say what is wrong
        return None


def gguf_path(details: ModelDetails, engine: str) -> Path:
    if details.model_path is None or details.gguf is None:
        raise BackendUnavailable(f"{details.name.display} has no GGUF model layer; {engine} cannot run it")
    return details.model_path
