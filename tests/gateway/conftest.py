"""A live ``infer serve`` subprocess on a free loopback port, serving the tiny test models.

``live_server`` is module-scoped (starting llama.cpp models costs a second or two); it yields a
``LiveServer`` with ``.url``, ``.db_url`` and ``.log()`` (the server's output so far).
``app_client`` runs the same app in-process with ``TestClient`` for fast contract tests.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LiveServer:
    url: str
    port: int
    home: Path
    db_url: str
    process: subprocess.Popen
    log_path: Path
    engine: str = "llamacpp"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def server_env(home: Path, models: Path, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFER_", "OLLAMA_"))}  # OLLAMA_* are read too
    env.update(INFER_HOME=str(home), INFER_MODELS=str(models), INFER_HOST=f"127.0.0.1:{port}")
    env.update(extra)
    return env


def new_key(server: LiveServer, *args: str) -> str:
    """`infer keys create ARGS` against the server's ledger; the new key."""
    done = subprocess.run([sys.executable, "-m", "cli", "keys", "create", *args, "--db", server.db_url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def query(server: LiveServer, sql: str, **params) -> list[tuple]:
    """Rows of `sql` on the server's ledger."""
    db = sa.create_engine(server.db_url)
    try:
        with db.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql), params)]
    finally:
        db.dispose()


def _die_with_pytest() -> None:
    """In the child before exec: SIGKILL it when pytest dies (Linux PR_SET_PDEATHSIG), so a crashed or
    killed test run leaves no server (and so no runner) behind. The signal follows the death of the
    *thread* that started the child, so only servers started on pytest's main thread get it."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)


def start_server(tmp: Path, models: Path, cwd: Path | None = None, **extra_env: str) -> LiveServer:
    """``infer serve`` as a subprocess; with ``cwd``, started from that directory as the ``infer`` console
    script starts it (the directory is not on its import path; this checkout is)."""
    port = free_port()
    home = tmp / "server-home"
    log_path = tmp / "server.log"
    env = server_env(home, models, port, **extra_env)
    command = [sys.executable, "-m", "cli", "serve", "--log-level", "warning"]
    if cwd is not None:
        command.insert(1, "-P")
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    main_thread = threading.current_thread() is threading.main_thread()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_pytest if main_thread else None)
    db_url = extra_env.get("INFER_DATABASE_URL") or f"sqlite:///{home / 'usage.db'}"
    server = LiveServer(f"http://127.0.0.1:{port}", port, home, db_url, proc, log_path,
                        engine=extra_env.get("INFER_ENGINE", "llamacpp"))
    _wait_ready(server)
    return server


def stop_server(server: LiveServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def _wait_ready(server: LiveServer, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"infer serve exited early:\n{server.log()}")
        try:
            if httpx.get(server.url + "/", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    stop_server(server)
    raise RuntimeError(f"infer serve did not start in {timeout}s:\n{server.log()}")


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
