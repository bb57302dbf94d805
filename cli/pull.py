"""``infer pull`` and ``infer push``."""

from __future__ import annotations

import typer

from registry.client import RegistryClient
from registry.errors import RegistryError
from registry.names import parse_name
from registry.pull import pull_model
from registry.push import push_model

from .common import get_store, run_async, settings
from .progress import ProgressRenderer

INSECURE = typer.Option(False, "--insecure", help="Allow plain-http registries (e.g. a loopback mirror).")


def register(app: typer.Typer) -> None:
    app.command("pull")(pull_cmd)
    app.command("push")(push_cmd)


def pull_cmd(model: str = typer.Argument(..., help="[host/][namespace/]model[:tag], e.g. qwen2:0.5b"),
             insecure: bool = INSECURE) -> None:
    """Pull a model from a registry into the local store (resumable, verified)."""
    cfg = settings()
    name = parse_name(model, insecure=insecure or cfg.insecure)
    store = get_store()

    async def go() -> None:
        async with RegistryClient(basic_auth=cfg.registry_auth) as client:
            await pull_model(store, name, client, renderer)

    with ProgressRenderer() as renderer:
        _interruptible(lambda: run_async(go()), f"pull interrupted; run 'infer pull {model}' again to resume")


def push_cmd(model: str = typer.Argument(..., help="host/namespace/model[:tag] of a local model"),
             insecure: bool = INSECURE) -> None:
    """Push a local model to a registry (OCI blob upload, then the manifest)."""
    cfg = settings()
    scheme = parse_name(model, insecure=insecure or cfg.insecure).scheme
    store = get_store()
    local = store.resolve(model)
    name = local.with_host(local.host, scheme=scheme)

    async def go() -> None:
        async with RegistryClient(basic_auth=cfg.registry_auth) as client:
            await push_model(store, name, client, renderer)

    with ProgressRenderer() as renderer:
        _interruptible(lambda: run_async(go()), "push interrupted; run it again to finish")


def _interruptible(fn, message: str) -> None:
    try:
        fn()
    except KeyboardInterrupt:
        raise RegistryError(message) from None
