"""``infer ps`` and ``infer stop MODEL``: what the running server has loaded, and unloading one.

Both talk to the server at ``INFER_HOST`` (``OLLAMA_HOST``) like ``ollama ps``/``ollama stop``:
``GET /api/ps``, and a ``POST /api/generate`` with ``keep_alive: 0`` (the model unloads now).
"""

from __future__ import annotations

import time

import typer

from core.errors import BackendError
from core.settings import client_url

from .client import NotFound, ServerClient
from .format import human_bytes, human_span, human_until, parse_time, table


def register(app: typer.Typer) -> None:
    app.command("ps")(ps_cmd)
    app.command("stop")(stop_cmd)


def _client() -> ServerClient:
    return ServerClient(client_url())


def ps_cmd() -> None:
    """List the models the running server has loaded, with the runner process(es) serving each: a
    tensor-parallel model's group has one process per rank (TP), their PIDs rank 0 first."""
    answer = _client().call("GET", "/api/ps")
    rows = [["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL", "ENGINE", "TP", "PID", "MEMORY"]]
    for m in answer.get("models") or []:
        runner = m.get("runner") or {}
        rows.append([m.get("name", ""), (m.get("digest") or "")[:12], human_bytes(m.get("size") or 0),
                     processor(m.get("size") or 0, m.get("size_vram") or 0), str(m.get("context_length") or ""),
                     _until(m, runner), runner.get("engine", ""), str(runner.get("tensor_parallel", "")),
                     ",".join(str(p) for p in runner.get("pids") or [runner.get("pid", "")]),
                     human_bytes(runner["memory"]) if runner.get("memory") else ""])
    typer.echo(table(rows))
    for f in answer.get("failures") or []:
        wait = parse_time(f["retry_at"]) - time.time()
        when = f"in {human_span(wait).lower()}" if wait > 0 else "on the next request"
        typer.echo(f"{f['name']} ({f['engine']}): {f['crashes']} crash(es) in a row, last: {f['error']}; "
                   f"next start {when}")


def _until(model: dict, runner: dict) -> str:
    state = runner.get("state")
    if state == "loading":
        return "loading"
    if runner.get("requests"):
        return f"busy ({runner['requests']})" if state != "stopping" else "stopping"
    return human_until(parse_time(model.get("expires_at")))


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
