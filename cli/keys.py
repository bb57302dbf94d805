"""``infer keys``: API keys for ``infer serve`` (role, budgets, per-minute limits, output cap, allowed routes)."""

from __future__ import annotations

import typer

from core.durations import parse_period
from core.settings import SettingsError
from ledger.keys import create_key, list_keys, revoke_key

from .common import settings
from .format import table
from .usage import _open

app = typer.Typer(help="API keys: create (shown once), list, revoke.", no_args_is_help=True)
DB = typer.Option(None, "--db", metavar="URL", help="Usage ledger (default: INFER_DATABASE_URL or $INFER_HOME/usage.db).")


@app.command("create")
def create_cmd(
    name: str = typer.Argument(..., help="A name for the key; usage rows carry it."),
    budget_usd: float = typer.Option(None, "--budget-usd", min=0, help="Spend allowed per period, in dollars."),
    period: str = typer.Option("30d", "--period", help="The budget's period: 1h, 24h, 30d, ..."),
    rpm: int = typer.Option(None, "--rpm", min=1, help="Requests per minute."),
    tpm: int = typer.Option(None, "--tpm", min=1, help="Tokens (in + out) per minute."),
    routes: str = typer.Option(None, "--routes", help="Comma-separated models or routes the key may use."),
    max_tokens: int = typer.Option(None, "--max-tokens", min=1, help="The most tokens one request may generate "
                                   "(requests asking for more, or for no limit, stop there)."),
    operator: bool = typer.Option(False, "--operator", help="An operator key: model management (create, delete, "
                                  "copy, pull, push, blobs), /infer/cost and /metrics, besides what callers may do."),
    db: str = DB,
) -> None:
    """Create a key and print it once: only its hash is stored."""
    try:
        seconds = parse_period(period)
    except ValueError as exc:
        raise SettingsError(f"--period: {exc}") from None
    engine = _open(db or settings().database_url)
    try:
        key = create_key(engine, name, budget_usd=budget_usd, period_s=seconds if budget_usd is not None else None,
                         rpm=rpm, tpm=tpm, routes=tuple(r.strip() for r in (routes or "").split(",") if r.strip()),
                         role="operator" if operator else "caller", max_output_tokens=max_tokens)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    finally:
        engine.dispose()
    typer.echo(key)
    role = "an operator key" if operator else "a caller key"
    typer.echo(f"key '{name}' created ({role}); it is shown only now: keep it (clients send Authorization: Bearer "
               "<key>, or x-api-key: <key>)", err=True)


@app.command("list")
def list_cmd(db: str = DB) -> None:
    """Keys with their budget use and limits (never the keys themselves)."""
    engine = _open(db or settings().database_url)
    try:
        keys = list_keys(engine)
    finally:
        engine.dispose()
    rows = [["name", "role", "status", "spent $", "reserved $", "budget $", "rpm", "tpm", "max tokens", "routes"]]
    for k in keys:
        rows.append([k.name, k.role, "revoked" if k.revoked else "active", f"{k.spent_usd:.6f}",
                     f"{k.reserved_usd:.6f}", "-" if k.budget_usd is None else f"{k.budget_usd:.6f}",
                     str(k.rpm or "-"), str(k.tpm or "-"), str(k.max_output_tokens or "-"), ",".join(k.routes) or "all"])
    typer.echo(table(rows) if keys else "No keys yet: infer keys create NAME")


@app.command("revoke")
def revoke_cmd(name: str = typer.Argument(...), db: str = DB) -> None:
    """Revoke a key: requests with it get 401 within a few seconds."""
    engine = _open(db or settings().database_url)
    try:
        if not revoke_key(engine, name):
            raise SettingsError(f"no active key named '{name}' (infer keys list)")
    finally:
        engine.dispose()
    typer.echo(f"revoked {name}")
