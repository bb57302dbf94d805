"""Helpers the Ollama routes share: preloading/unloading a model, local model details.

``load_or_unload`` answers Ollama's "empty request" convention: an empty prompt (or no messages)
loads the model and ``keep_alive: 0`` unloads it.
"""

from __future__ import annotations

import logging
from typing import Any

from core.errors import ModelNotFound
from gateway.serving.router import Router
from registry.details import ModelDetails, details_cache
from registry.errors import InvalidName, ModelNotFound as StoreModelNotFound
from registry.names import ModelName
from registry.store import Store

log = logging.getLogger(__name__)


async def load_or_unload(router: Router, model: str, keep_alive: float | None, options: dict[str, Any],
                         *, engine: str | None = None, embedding: bool = False) -> str:
    """Load ``model`` (``"load"``) or, with ``keep_alive == 0``, unload it (``"unload"``); 404 if unknown."""
    if keep_alive == 0:
        router.require(model)
        await router.unload(model)
        return "unload"
    if embedding:
        router.require(model)
    else:
        await router.load(model, engine=engine, options=options, keep_alive=keep_alive)
    return "load"


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
