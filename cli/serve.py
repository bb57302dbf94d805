"""``infer serve``: the Ollama + OpenAI API on 127.0.0.1:11434 (``INFER_HOST`` to change)."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from gateway.backends_config import load_config
from adapters.durations import parse_duration
from gateway.settings import ServerSettings, SettingsError, parse_host


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    host: str = typer.Option(None, "--host", help="[scheme://]host[:port] to bind (default: INFER_HOST or 127.0.0.1:11434)."),
    db: str = typer.Option(None, "--db", help="Usage ledger SQLAlchemy URL (default: INFER_DATABASE_URL or $INFER_HOME/usage.db)."),
    num_parallel: int = typer.Option(None, "--num-parallel", help="Concurrent requests per model (INFER_NUM_PARALLEL)."),
    keep_alive: str = typer.Option(None, "--keep-alive", help="How long idle models stay loaded, e.g. 5m, -1 (INFER_KEEP_ALIVE)."),
    context_length: int = typer.Option(None, "--context-length", help="Default num_ctx (INFER_CONTEXT_LENGTH)."),
    engine: str = typer.Option(None, "--engine", help="In-process engine for store models: llamacpp or native "
                               "(INFER_ENGINE); a request's \"engine\" option overrides it."),
    config: Path = typer.Option(None, "--config", help="YAML file listing remote backends (vLLM, TGI, "
                                "TensorRT-LLM, Triton, Ollama, llama.cpp, OpenAI) served next to the store's models "
                                "(INFER_CONFIG)."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Start the API server (Ollama /api/* and OpenAI /v1/*)."""
    import uvicorn

    from gateway.app import create_app

    overrides = {"database_url": db, "num_parallel": num_parallel, "context_length": context_length,
                 "engine": engine, "config": config}
    try:
        if host:
            overrides["host"], overrides["port"] = parse_host(host)
        if keep_alive:
            overrides["keep_alive"] = parse_duration(keep_alive)
        settings = ServerSettings.from_env(**overrides)
        backends = load_config(settings.config).remote_settings() if settings.config else []
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    typer.echo(f"infer serve listening on {settings.base_url} (models: {settings.registry.models})", err=True)
    for entry in backends:
        typer.echo(f"  {entry.name} -> {entry.type} {entry.base_url} ({entry.model})", err=True)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level.lower(),
                timeout_graceful_shutdown=5)
