"""The live-server fixtures over the tiny test models (the harness itself is fakes/live.py).

``live_server`` is module-scoped (starting llama.cpp models costs a second or two); it yields a
``LiveServer`` with ``.url``, ``.db_url`` and ``.log()`` (the server's output so far).
``app_client`` runs the same app in-process with ``TestClient`` for fast contract tests.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakes.live import LiveServer, server_env, start_server, stop_server


def private_store(tiny_store, tmp_path_factory, label: str):
    """A copy of the session's tiny models for a module that creates, pulls or deletes models."""
    import shutil

    from registry.store import Store

    root = tmp_path_factory.mktemp(label) / "models"
    shutil.copytree(tiny_store.root, root)
    return Store(root)


@pytest.fixture(scope="module", params=["llamacpp", pytest.param("native", marks=pytest.mark.slow)])
def live_server(request, tiny_store, tmp_path_factory) -> Iterator[LiveServer]:
    """The API tests run once per in-process engine (INFER_ENGINE); the native engine's pass is in the slow
    tier (the default tier keeps it through the speculative, LoRA, token-array and runner tests)."""
    server = start_server(tmp_path_factory.mktemp("live"), tiny_store.root, INFER_ENGINE=request.param)
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture
def app_client(tiny_store, tmp_path):
    """The app in-process (lifespan included) over the tiny store, with its own ledger."""
    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from core.settings import ServerSettings

    env = server_env(tmp_path / "home", tiny_store.root, 11434)
    settings = ServerSettings.from_env(env)
    with TestClient(create_app(settings), base_url="http://127.0.0.1:11434") as client:
        yield client


from tests.gateway.agent_gateway import agent_gateway  # noqa: E402,F401  (the agent APIs' live server)
