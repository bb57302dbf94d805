"""``infer usage``: the latest requests from the usage ledger, then totals per model."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime

import typer
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from ledger.db import open_db
from core.settings import SettingsError
from ledger.tables import RequestLog
from ledger.usage import ModelTotals, recent, totals_by_model

from .common import settings
from .format import table


def register(app: typer.Typer) -> None:
    app.command("usage")(usage_cmd)


def usage_cmd(
    limit: int = typer.Option(20, "--limit", "-n", min=1, help="How many recent requests to show."),
    model: str | None = typer.Option(None, "--model", "-m", help="Only this model."),
    as_json: bool = typer.Option(False, "--json", help="Print requests and totals as JSON."),
    db: str | None = typer.Option(None, "--db", metavar="URL",
                                  help="SQLAlchemy URL (default: INFER_DATABASE_URL, else $INFER_HOME/usage.db)."),
) -> None:
    """Show recent requests and token totals per model from the usage ledger."""
    engine = _open(db or settings().database_url)
    rows = recent(engine, limit=limit, model=model)
    totals = [t for t in totals_by_model(engine) if model is None or t.model == model]
    engine.dispose()
    if as_json:
        requests = [{name: getattr(r, name) for name in RequestLog.model_fields} for r in rows]
        typer.echo(json.dumps({"requests": requests, "totals": [asdict(t) for t in totals]}, indent=2))
    elif not rows:
        typer.echo("No requests recorded yet.")
    else:
        typer.echo(render_usage(rows, totals))


def _open(url: str) -> Engine:
    try:
        return open_db(url)
    except (ValueError, OSError, SQLAlchemyError) as exc:
        raise SettingsError(_reason(exc)) from exc  # cli.main prints it as one line


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValueError):
        return str(exc)
    return f"cannot open the usage database: {getattr(exc, 'orig', None) or exc}"


def render_usage(rows: list[RequestLog], totals: list[ModelTotals]) -> str:
    recent_rows = [["TIME", "MODEL", "SOURCE", "ROUTE", "STATUS", "IN", "CACHED", "OUT", "TTFT (ms)", "TPOT (ms)",
                    "TOTAL (ms)"]]
    recent_rows += [[_local_time(r.datetime_utc), r.model, r.source, r.route, r.status, str(r.input_tokens),
                     _count(r.cached_input_tokens), str(r.output_tokens), _ms(r.ttft_ms), _ms(r.tpot_ms),
                     _ms(r.total_ms)] for r in rows]
    total_rows = [["MODEL", "REQUESTS", "ERRORS", "INPUT TOKENS", "OUTPUT TOKENS", "CACHED"]]
    total_rows += [[t.model, str(t.requests), str(t.errors), str(t.input_tokens), str(t.output_tokens),
                    str(t.cached_input_tokens)] for t in totals]
    return f"{table(recent_rows)}\n\nTotals per model\n{table(total_rows)}"


def _local_time(datetime_utc: str) -> str:
    return datetime.fromisoformat(datetime_utc).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
