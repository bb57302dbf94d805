"""Running the registry: in the foreground (``infer registry serve``) or on a background thread."""

from __future__ import annotations

import threading
import time

import uvicorn

from ..names import ModelName, parse_name
from ..store import Store
from .app import create_registry_app


def _config(store: Store, host: str, port: int, auth: str | None, log_level: str) -> uvicorn.Config:
    app = create_registry_app(store, auth=auth)
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, lifespan="on")


def serve_registry(store: Store, host: str = "127.0.0.1", port: int = 8787, auth: str | None = None,
                   log_level: str = "info") -> None:
    """Serve ``store`` until interrupted (Ctrl-C)."""
    uvicorn.Server(_config(store, host, port, auth, log_level)).run()


class RegistryServerThread:
    """Runs the registry on a background thread (port 0 = a free port); a context manager.

    ``with RegistryServerThread(store) as server: ... server.url ...``"""

    def __init__(self, store: Store, *, host: str = "127.0.0.1", port: int = 0, auth: str | None = None) -> None:
        self.store, self.host, self.auth = store, host, auth
        # uvicorn installs no signal handlers off the main thread: stop() is the way out
        self._server = uvicorn.Server(_config(store, host, port, auth, "warning"))
        self._thread = threading.Thread(target=self._server.run, name="registry-server", daemon=True)
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def name(self, text: str) -> ModelName:
        """A model name on this server, e.g. ``name("library/tiny:latest")``."""
        return parse_name(f"{self.url}/{text}", insecure=True)

    def start(self) -> "RegistryServerThread":
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("registry server did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> "RegistryServerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
