"""``infer ps`` and ``infer stop MODEL``: what the running server has loaded, and unloading one.

Both talk to the server at ``INFER_HOST`` (``OLLAMA_HOST``) like ``ollama ps``/``ollama stop``:
``GET /api/ps``, and a ``POST /api/generate`` with ``keep_alive: 0`` (the model unloads now).
"""

from __future__ import annotations

import os
import typer

from adapters.core.errors import BackendError
from gateway.settings import client_url

from .client import NotFound, ServerClient
from .format import human_bytes, human_until, parse_time, table


def register(app: typer.Typer) -> None:
    app.command("ps")(ps_cmd)
    app.command("stop")(stop_cmd)


def _client() -> ServerClient:
    return ServerClient(client_url(dict(os.environ)))


def ps_cmd() -> None:
    """List the models the running server has loaded."""
    rows = [["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]]
    for m in _client().call("GET", "/api/ps").get("models") or []:
        rows.append([m.get("name", ""), (m.get("digest") or "")[:12], human_bytes(m.get("size") or 0),
                     processor(m.get("size") or 0, m.get("size_vram") or 0), str(m.get("context_length") or ""),
                     human_until(parse_time(m.get("expires_at")))])
    typer.echo(table(rows))


def stop_cmd(model: str = typer.Argument(..., help="A model the server has loaded.")) -> None:
    """Unload a model from the running server now."""
    client = _client()
    loaded = [m.get("name") or "" for m in client.call("GET", "/api/ps").get("models") or []]
    if not any(_same(model, name) for name in loaded):
        try:
            client.call("POST", "/api/show", {"model": model})
        except NotFound:
            raise BackendError(f'couldn\'t find model "{model}" to stop') from None
        raise BackendError(f"model '{model}' is not running")
    client.call("POST", "/api/generate", {"model": model, "keep_alive": 0})


def processor(size: int, size_vram: int) -> str:
    """``100% CPU``, ``100% GPU`` or ``48%/52% CPU/GPU``, as Ollama's ps computes it."""
    if size_vram <= 0 or size <= 0:
        return "100% CPU"
    if size_vram >= size:
        return "100% GPU"
    gpu = round(100 * size_vram / size)
    return f"{100 - gpu}%/{gpu}% CPU/GPU"


def _same(a: str, b: str) -> bool:
    return a.lower().removesuffix(":latest") == b.lower().removesuffix(":latest")
