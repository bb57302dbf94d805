"""The uvicorn server behind ``infer serve``, with a shutdown that answers every running request.

On SIGTERM/SIGINT uvicorn stops accepting connections and waits ``timeout_graceful_shutdown``
for running responses, then cuts them. Here, requests still running near the end of that grace
period end first with an error event (``ShuttingDown``, 503) and their ledger row, so no client
sees a stream cut without a word; then the lifespan flushes the ledger and the process exits.

The access log is uvicorn's line, written by :class:`~gateway.http.access_log.AccessLog` once the
response has left rather than before its first byte.
"""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from gateway.app import begin_shutdown
from gateway.http.access_log import AccessLog, take_over
from core.settings import ServerSettings


class GatewayServer(uvicorn.Server):
    def __init__(self, app: FastAPI, settings: ServerSettings, log_level: str) -> None:
        super().__init__(uvicorn.Config(AccessLog(app), host=settings.host, port=settings.port, log_level=log_level,
                                        timeout_graceful_shutdown=settings.shutdown_grace))
        take_over()  # uvicorn's access line, written after the response instead of before it
        self.app, self.grace = app, settings.shutdown_grace

    def handle_exit(self, sig, frame) -> None:
        if not self.should_exit:
            begin_shutdown(self.app, self.grace)
        super().handle_exit(sig, frame)
