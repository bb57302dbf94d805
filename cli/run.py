"""``infer run MODEL [PROMPT...]``: one answer with a prompt (or piped stdin), else the interactive REPL."""

from __future__ import annotations

import json
import sys

import typer

from adapters.engines import check_engine
from ledger.db import database_url_from_env
from adapters.durations import parse_duration
from gateway.settings import SettingsError
from registry.errors import RegistryError
from registry.store import Store

from . import pull
from .common import get_store, run_async, settings

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
    engine: str = typer.Option(None, "--engine", help="In-process engine: llamacpp or native (PyTorch); "
                               "default INFER_ENGINE, else llamacpp."),
    insecure: bool = pull.INSECURE,
    db: str = typer.Option(None, "--db", metavar="URL", help="Usage ledger URL (default: INFER_DATABASE_URL "
                           "or $INFER_HOME/usage.db)."),
) -> None:
    """Run a model: answer a prompt, or chat interactively (/? for help)."""
    from .chat_session import ChatSession, local_settings_from_env  # llama.cpp: imported only when running

    options = {"format": _format(format), "keep_alive": _keep_alive(keepalive),
               "settings": local_settings_from_env(check_engine(engine) if engine else None)}
    store = get_store()
    model = _ensure_model(store, model, insecure)
    text = _prompt_text(prompt or [])
    session = ChatSession(store, model, db_url=db or database_url_from_env(settings().home), verbose=verbose,
                          **options)
    if text is None:
        from .repl import run_repl

        run_repl(session)
    else:
        _one_shot(session, text)


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
