"""``infer run MODEL [PROMPT...]``: one answer with a prompt (or piped stdin), else the interactive REPL.

When a server answers at ``INFER_HOST`` (``OLLAMA_HOST``; default 127.0.0.1:11434) — ``infer serve``
or Ollama — the turns go to it (``cli.remote_session``): the model stays warm there for
``--keepalive``, and the server's ledger gets the row. Otherwise, or with ``--local``, the model
runs in this process (``cli.chat_session``). The output and ``--verbose`` statistics are the same.
"""

from __future__ import annotations

import json
import sys

import typer

from adapters.engines.local import check_engine
from core.durations import parse_duration
from core.settings import ClientSettings, SettingsError
from registry.errors import RegistryError
from registry.progress import ProgressEvent
from registry.store import Store

from . import pull
from .client import NotFound, ServerClient, find_server
from .common import get_store, run_async, settings
from .progress import ProgressRenderer

MODEL = typer.Argument(None, metavar="MODEL", help="Model to run (default: the most recently pulled or created).")
PROMPT = typer.Argument(None, metavar="PROMPT", help="Prompt; without one (and no piped stdin) start a chat.")


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)


def run_cmd(
    model: str = MODEL,
    prompt: list[str] = PROMPT,
    verbose: bool = typer.Option(False, "--verbose", help="Print timings and token rates after each answer."),
    keepalive: str = typer.Option(None, "--keepalive", help="How long the model stays loaded (e.g. 5m)."),
    format: str = typer.Option(None, "--format", help="Response format: json, or a JSON schema."),
    nowordwrap: bool = typer.Option(False, "--nowordwrap", help="Don't wrap words (accepted; output is raw)."),
    engine: str = typer.Option(None, "--engine", help="Engine for store models: llamacpp or native (PyTorch); "
                               "default INFER_ENGINE (the server's, through a server), else llamacpp."),
    insecure: bool = pull.INSECURE,
    db: str = typer.Option(None, "--db", metavar="URL", help="Usage ledger URL of an in-process run (default: "
                           "INFER_DATABASE_URL or $INFER_HOME/usage.db); implies --local."),
    local: bool = typer.Option(False, "--local", help="Run in this process even when a server answers at "
                               "INFER_HOST (also INFER_LOCAL=1)."),
) -> None:
    """Run a model: answer a prompt, or chat interactively (/? for help).

    Uses the server at INFER_HOST (or OLLAMA_HOST, default 127.0.0.1:11434) when one answers, so the
    model stays loaded there; otherwise runs the model in this process."""
    options = {"format": _format(format), "keep_alive": _keep_alive(keepalive)}
    found = None if local or db or ClientSettings.from_env().local else find_server()
    if found:
        session = _remote_session(found[0], model, insecure, engine, verbose, options)
    else:
        session = _local_session(model, insecure, engine, db, verbose, options)
    text = _prompt_text(prompt or [])
    if text is None:
        from .repl import run_repl

        run_repl(session)
    else:
        _one_shot(session, text)


def _local_session(model: str | None, insecure: bool, engine: str | None, db: str | None, verbose: bool,
                   options: dict):
    from .chat_session import ChatSession, local_settings_from_env  # llama.cpp: imported only when running

    local = local_settings_from_env(check_engine(engine) if engine else None)
    store = get_store()
    model = _ensure_model(store, model, insecure)
    return ChatSession(store, model, db_url=db or settings().database_url, verbose=verbose,
                       settings=local, **options)


def _remote_session(client: ServerClient, model: str | None, insecure: bool, engine: str | None, verbose: bool,
                    options: dict):
    from .remote_session import RemoteChatSession

    model = _ensure_served(client, model, insecure)
    return RemoteChatSession(client, model, verbose=verbose, engine=check_engine(engine) if engine else None,
                             **options)


def _ensure_served(client: ServerClient, model: str | None, insecure: bool) -> str:
    """As ``ollama run``: the newest model when none is named; a model the server lacks is pulled there."""
    if model is None:
        models = client.call("GET", "/api/tags").get("models") or []
        if not models:
            raise RegistryError("no models yet: run 'infer pull MODEL' first")
        return models[0]["name"]
    try:
        client.call("POST", "/api/show", {"model": model})
    except NotFound:
        with ProgressRenderer() as renderer:
            for line in client.stream("/api/pull", {"model": model, "insecure": insecure or settings().insecure}):
                renderer(ProgressEvent(line.get("status", ""), line.get("digest"), line.get("total"),
                                       line.get("completed")))
    return model


def _ensure_model(store: Store, model: str | None, insecure: bool) -> str:
    if model is None:
        models = store.list_models()
        if not models:
            raise RegistryError("no models yet: run 'infer pull MODEL' first")
        return models[0].name.display
    if not store.manifest_path(store.resolve(model)).is_file():
        pull.pull_cmd(model, insecure=insecure)
    return model


def _prompt_text(words: list[str]) -> str | None:
    """The prompt words and piped stdin (after a blank line); None means interactive."""
    parts = [" ".join(words)] if words else []
    if not sys.stdin.isatty():
        parts.append(sys.stdin.read())
    elif not parts:
        return None
    return "\n\n".join(p for p in parts if p)


def _one_shot(session, text: str) -> None:
    async def go() -> None:
        try:
            if text:
                await session.send(text, truncate=False)
        finally:
            await session.aclose()

    try:
        run_async(go())
    except KeyboardInterrupt:
        typer.echo("")
        raise typer.Exit(130) from None


def _format(value: str | None) -> str | dict | None:
    if not value:
        return None
    if value == "json":
        return "json"
    try:
        schema = json.loads(value)
    except ValueError:
        schema = None
    if not isinstance(schema, dict):
        raise SettingsError(f"invalid --format {value!r}: use 'json' or a JSON schema object")
    return schema


def _keep_alive(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise SettingsError(f"invalid --keepalive: {exc}") from None
