"""``infer serve``: the Ollama + OpenAI API on 127.0.0.1:11434 (``INFER_HOST`` to change)."""

from __future__ import annotations

import errno
import logging
import socket
from pathlib import Path

import typer

from core.durations import parse_keep_alive
from gateway.policy.access import exposure_warnings
from core.settings import ServerSettings, SettingsError, parse_host


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    host: str = typer.Option(None, "--host", help="[scheme://]host[:port] to bind (default: INFER_HOST, "
                            "OLLAMA_HOST or 127.0.0.1:11434)."),
    db: str = typer.Option(None, "--db", help="Usage ledger SQLAlchemy URL (default: INFER_DATABASE_URL or $INFER_HOME/usage.db)."),
    num_parallel: int = typer.Option(None, "--num-parallel", help="Concurrent requests per model (INFER_NUM_PARALLEL)."),
    keep_alive: str = typer.Option(None, "--keep-alive", help="How long idle models stay loaded, e.g. 5m, -1 (INFER_KEEP_ALIVE)."),
    context_length: int = typer.Option(None, "--context-length", help="Default num_ctx (INFER_CONTEXT_LENGTH)."),
    engine: str = typer.Option(None, "--engine", help="In-process engine for store models: llamacpp or native "
                               "(INFER_ENGINE); a request's \"engine\" option overrides it."),
    speculative: str = typer.Option(None, "--speculative", help="Speculative decoding in the native engine: "
                                    "ngram[:k=4], draft:MODEL[:k=4] or off (INFER_SPECULATIVE); a Modelfile's "
                                    "PARAMETER speculative overrides it, a request's \"speculative\" turns it off/on."),
    config: Path = typer.Option(None, "--config", help="YAML file listing remote backends (vLLM, TGI, "
                                "TensorRT-LLM, Triton, Ollama, llama.cpp, OpenAI) served next to the store's models "
                                "(INFER_CONFIG)."),
    redis_url: str = typer.Option(None, "--redis-url", help="Redis URL for per-key rate limits shared by "
                                  "replicas (INFER_REDIS_URL); in process memory without it."),
    tensor_parallel: int = typer.Option(None, "--tensor-parallel", min=1, help="Processes each native-engine model "
                                        "is split over (tensor parallelism; INFER_TENSOR_PARALLEL); a Modelfile's "
                                        "PARAMETER tensor_parallel overrides it."),
    role: str = typer.Option(None, "--role", help="The native engine's part in prefill/decode disaggregation: "
                             "prefill, decode or both (INFER_KV_ROLE; vLLM's kv_role); see routes' prefill:/decode:."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Start the API server (Ollama /api/* and OpenAI /v1/*).

    Requests need a key (`Authorization: Bearer KEY` or `x-api-key: KEY`) when INFER_API_KEYS (comma-separated
    operator keys) is set or the config says `auth: {required: true}`; without either, only this machine
    should reach the server (the default 127.0.0.1)."""
    from gateway.app import create_app
    from gateway.server import GatewayServer

    overrides = {"database_url": db, "num_parallel": num_parallel, "context_length": context_length,
                 "engine": engine, "config": config, "redis_url": redis_url, "speculative": speculative,
                 "tensor_parallel": tensor_parallel, "kv_role": role}
    try:
        if host:
            overrides["host"], overrides["port"] = parse_host(host)
        if keep_alive:
            overrides["keep_alive"] = parse_keep_alive(keep_alive)
        settings = ServerSettings.from_env(**overrides)
        from gateway.backends_config import load_config  # the remote adapters (aiohttp) load with the server

        config = load_config(settings.config) if settings.config else None
        backends = config.remote_settings() if config is not None else []
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))  # no line per backend call
    sock = listen_socket(settings.host, settings.port)  # a port in use fails here, before "listening"
    auth = config.auth if config is not None else None
    for line in exposure_warnings(host=settings.host, loopback=settings.is_loopback,
                                  operator_keys=bool(settings.api_key_hashes), required=bool(auth and auth.required),
                                  public=auth.public() if auth is not None else ()):
        typer.echo(line, err=True)
    typer.echo(f"infer serve listening on {settings.bind_url} (models: {settings.registry.models})", err=True)
    for entry in backends:
        typer.echo(f"  {entry.name} -> {entry.type} {entry.base_url} ({entry.model})", err=True)
    GatewayServer(create_app(settings), settings, log_level.lower()).run(sockets=[sock])


def listen_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a busy port is one clear line and exit code 1."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise SettingsError(f"port {port} on {host} is already in use (another infer serve, or Ollama?); "
                                "stop it or choose another with --host / INFER_HOST") from None
        raise SettingsError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
