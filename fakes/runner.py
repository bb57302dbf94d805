"""uvicorn in a background thread on a free 127.0.0.1 port, stopped by ``stop()`` or the ``with`` exit."""

from __future__ import annotations

import socket
import threading
import time
from typing import Self

import uvicorn
from starlette.applications import Starlette

from .behaviour import Behaviour


class RunningServer:
    """A started fake backend: ``url`` (no trailing slash), ``behaviour``, ``kind``, ``stop()``."""

    def __init__(self, kind: str, app: Starlette, behaviour: Behaviour, lifespan: str = "off"):
        self.kind, self.behaviour = kind, behaviour
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", log_config=None, access_log=False, http="h11",
                                lifespan=lifespan, timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name=f"fake-{kind}", daemon=True)

    def start(self, timeout: float = 10.0) -> RunningServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"fake {self.kind} server did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
