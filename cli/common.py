"""Helpers shared by command modules: the store from settings, running coroutines."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from core.settings import RegistrySettings
from registry.store import Store

T = TypeVar("T")


def settings() -> RegistrySettings:
    return RegistrySettings.from_env()


def get_store() -> Store:
    return Store(settings().models)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)
