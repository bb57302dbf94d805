"""`infer registry serve`: serve a model store over the registry protocol (mirrors, air-gapped pulls)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import typer

from registry.store import Store

from .common import get_store, settings

DEFAULT_PORT = 8787

app = typer.Typer(help="Run a model registry.", no_args_is_help=True)


@app.callback()
def _registry() -> None:
    """Run a model registry."""


@app.command()
def serve(
    root: Path | None = typer.Option(None, "--root", help="Model store to serve [default: INFER_MODELS]."),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on (0.0.0.0 for every interface)."),
    port: int = typer.Option(DEFAULT_PORT, min=1, max=65535, help="TCP port to listen on."),
    auth: str | None = typer.Option(None, show_default=False, help="user:password; clients then need a token "
                                    "(pull and push) [default: INFER_REGISTRY_SERVE_AUTH]."),
) -> None:
    """Serve a model store so other machines can `infer pull` (and push) from it."""
    auth = auth or settings().registry_serve_auth
    if auth is not None and ":" not in auth:
        raise typer.BadParameter("expected user:password", param_hint="--auth")
    store = Store(root) if root else get_store()
    if auth is None and not _is_loopback(host):
        typer.echo(f"warning: serving on {host} without --auth: anyone who can reach it can push", err=True)
    typer.echo(f"serving {store.root} at http://{host}:{port}")
    from registry.server import serve_registry  # aiohttp: only for this command

    serve_registry(store, host=host, port=port, auth=auth, log_level="warning")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
