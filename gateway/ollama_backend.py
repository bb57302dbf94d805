"""Helpers the Ollama routes share: preloading/unloading a model, local model details.

``load_or_unload`` answers Ollama's "empty request" convention: an empty prompt (or no messages)
loads the model and ``keep_alive: 0`` unloads it. Backends may offer ``load(model, options,
keep_alive)`` (the llama.cpp one does); without it the model's existence is all that is checked.
"""

from __future__ import annotations

import logging

from adapters.base import Backend, ModelInfo
from adapters.errors import ModelNotFound
from registry.details import ModelDetails, details_cache
from registry.errors import InvalidName, ModelNotFound as StoreModelNotFound
from registry.names import ModelName
from registry.store import Store

log = logging.getLogger(__name__)

async def load_or_unload(backend: Backend, model: str, keep_alive: float | None, options: dict | None,
                         *, embedding: bool = False) -> str:
    """Load ``model`` (``"load"``) or, with ``keep_alive == 0``, unload it (``"unload"``); 404 if unknown."""
    if keep_alive == 0:
        require_model(backend, model)
        await backend.unload(model)
        return "unload"
    loader = getattr(backend, "load", None)
    if loader is not None and not embedding:
        await loader(model, options=options or {}, keep_alive=keep_alive)
    else:
        require_model(backend, model)
    return "load"


def require_model(backend: Backend, model: str) -> None:
    """Raise the backend's ModelNotFound (404) when it can tell that ``model`` does not exist."""
    details = getattr(backend, "details", None)
    if callable(details):
        details(model)


def resolve_local(store: Store, model: str) -> ModelName:
    """The local model a request names; ``model 'x' not found`` (404) when there is none."""
    try:
        name = store.resolve(model)
    except InvalidName:
        raise ModelNotFound(model) from None
    if not store.manifest_path(name).is_file():
        raise ModelNotFound(model)
    return name


def local_details(store: Store, model: str, *, verbose: bool = False) -> ModelDetails:
    name = resolve_local(store, model)
    try:
        return details_cache.get(store, name, verbose=verbose)
    except (StoreModelNotFound, FileNotFoundError):
        raise ModelNotFound(model) from None


def listing_details(store: Store, name: ModelName) -> ModelDetails | None:
    """Details for listings (/api/tags, /api/ps); None when unreadable, so a listing shows what it can."""
    try:
        return details_cache.get(store, name)
    except Exception as exc:
        log.warning("cannot read details of %s: %s", name.display, exc)
        return None


async def remote_models(backend: Backend) -> list[ModelInfo]:
    """Models served by the remote backends of ``infer serve --config`` (none without one)."""
    lister = getattr(backend, "remote_models", None)
    return await lister() if lister is not None else []
