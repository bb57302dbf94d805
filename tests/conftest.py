"""Every test gets its own INFER_HOME, so nothing touches the user's real store (nor reads OLLAMA_*)."""

from __future__ import annotations

import os

import pytest

# Triton decides between compiled and interpreted kernels when it is first imported: without a GPU,
# the kernel tests run the Triton launchers on CPU tensors in interpreter mode.
if not os.path.exists("/dev/nvidiactl"):  # no NVIDIA driver (checked without importing torch)
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def infer_home(tmp_path, monkeypatch):
    home = tmp_path / "infer-home"
    monkeypatch.setenv("INFER_HOME", str(home))
    for var in ("INFER_MODELS", "INFER_INSECURE", "INFER_REGISTRY_AUTH", "INFER_RAISE_ERRORS", "INFER_LOCAL"):
        monkeypatch.delenv(var, raising=False)
    for var in [v for v in os.environ if v.startswith("OLLAMA_")]:  # a developer's Ollama setup stays out
        monkeypatch.delenv(var)
    return home


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory):
    """A read-only store with the ``tiny`` and ``tiny-go`` models (see fakes/models.py)."""
    from fakes.models import install_tiny_models

    return install_tiny_models(tmp_path_factory.mktemp("tiny-models"))


def _throwaway(kind: str):
    """A server from ``tests/servers.py`` for the session; skips naming the package when it is missing."""
    import tests.servers

    try:
        server = getattr(tests.servers, kind)()
    except FileNotFoundError as exc:
        pytest.skip(f"{exc} (CI installs it in .ci/run)")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres():
    """A throwaway PostgreSQL cluster."""
    yield from _throwaway("Postgres")


@pytest.fixture(scope="session")
def redis_server():
    """A throwaway redis-server."""
    yield from _throwaway("Redis")


@pytest.fixture(scope="module")
def browser():
    """A headless Debian chromium through Playwright, for one test module (``tests/browser.py``). Its
    sync API runs an event loop on this thread meanwhile: no ``asyncio.run`` in such a module."""
    from tests.browser import CHROMIUM, chromium_missing

    missing = chromium_missing()
    if missing:
        pytest.skip(f"{missing} (CI installs it in .ci/run)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="session")
def tp_group():
    """tp_group(n) -> a tensor-parallel group of n ranks on the CPU (gloo), rank 0 in this process: made once
    per size for the whole session (starting the ranks costs seconds), and shared by the engines of every
    test (`LLMEngine(config, group=...)`: each engine's close only unloads its model from the ranks)."""
    groups = {}

    def get(world_size: int):
        import torch

        from native_engine.distributed.parallel_state import TensorParallelGroup

        if world_size not in groups:
            groups[world_size] = TensorParallelGroup.spawn(world_size, torch.device("cpu"))
        return groups[world_size]

    yield get
    from native_engine.distributed.parallel_state import Kind

    for group in groups.values():
        group.send_plan(Kind.EXIT)
        group.close()
