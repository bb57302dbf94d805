"""``infer cost``: what requests cost, settled exactly from the ledger (``pricing/settle.py``)."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

import typer

from core.durations import parse_period
from core.settings import SettingsError, config_file
from pricing.settle import GROUPS, cost_report

from .common import settings
from .format import table
from .usage import _open

app = typer.Typer(help="What requests cost: input, cached input and output, settled against each bill.",
                  invoke_without_command=True, no_args_is_help=False)

SINCE = typer.Option("24h", "--since", help="How far back: a duration such as 1h, 24h, 30d (d = 24h).")
CONFIG = typer.Option(None, "--config", help="The infer serve config with the pricing (default: INFER_CONFIG).")
DB = typer.Option(None, "--db", metavar="URL", help="Usage ledger (default: INFER_DATABASE_URL or $INFER_HOME/usage.db).")


@app.callback()
def cost_cmd(
    ctx: typer.Context,
    since: str = SINCE,
    by: str = typer.Option("backend", "--by", help=f"Group by {', '.join(GROUPS)}."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    as_csv: bool = typer.Option(False, "--csv", help="Print the groups as CSV."),
    config: Path = CONFIG,
    db: str = DB,
) -> None:
    """Requests, tokens and $ per group, $ per million input and output tokens, and for hour-priced
    backends the bill and the share of its windows that carried traffic."""
    if ctx.invoked_subcommand is not None:
        return
    report = _report(since, by, config, db)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    elif as_csv:
        typer.echo(_csv(report["groups"]), nl=False)
    else:
        typer.echo(_render(report))


@app.command("compare")
def compare_cmd(since: str = SINCE, config: Path = CONFIG, db: str = DB) -> None:
    """Backends serving the same route, side by side: $ per million input and output tokens."""
    path = _config_path(config)
    from gateway.backends_config import load_config  # the remote adapters: only when a config is read

    routes = load_config(path).routes if path else []
    report = {g["key"]: g for g in _report(since, "backend", config, db)["groups"]}
    if not routes:
        raise SettingsError("no routes to compare: give --config (or INFER_CONFIG) with a 'routes:' list")
    for route in routes:
        rows = [["backend", "requests", "$/Mtok in", "$/Mtok out", "total $"]]
        for name in route.members:
            g = report.get(name)
            rows.append([name, str(g["requests"]) if g else "0", _usd(g and g["usd_per_mtok_input"]),
                         _usd(g and g["usd_per_mtok_output"]), _usd(g and g["total_cost_usd"])])
        typer.echo(f"route {route.name}\n{table(rows)}\n")


def _report(since: str, by: str, config: Path | None, db: str | None) -> dict:
    try:
        seconds = parse_period(since)
    except ValueError as exc:
        raise SettingsError(f"--since: {exc}") from None
    path = _config_path(config)
    from gateway.backends_config import load_config

    prices = load_config(path).priced(settings().home) if path else []
    engine = _open(db or settings().database_url)
    try:
        return cost_report(engine, prices, since=time.time() - seconds, by=by)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    finally:
        engine.dispose()


def _config_path(config: Path | None) -> Path | None:
    return config or config_file()


def _render(report: dict) -> str:
    rows = [[report["by"], "requests", "in tok", "cached tok", "out tok", "in $", "cached $", "out $", "total $",
             "$/Mtok in", "$/Mtok out", "settled − provisional $"]]
    for g in report["groups"]:
        rows.append([g["key"], str(g["requests"]), str(g["input_tokens"]), str(g["cached_input_tokens"]),
                     str(g["output_tokens"]), _usd(g["input_cost_usd"]), _usd(g["cached_input_cost_usd"]),
                     _usd(g["output_cost_usd"]), _usd(g["total_cost_usd"]), _usd(g["usd_per_mtok_input"]),
                     _usd(g["usd_per_mtok_output"]), _usd(g["difference_usd"])])
    lines = [f"since {report['since']}", table(rows), "(in tok: uncached prompt tokens; cached tok: prompt tokens "
             "the backend served from its KV cache)"]
    for name, bill in report["bills"].items():
        lines.append(f"{name}: bill ${_usd(bill['bill_usd'])} = in ${_usd(bill['input_usd'])} + cached "
                     f"${_usd(bill['cached_input_usd'])} + out ${_usd(bill['output_usd'])} "
                     f"+ idle ${_usd(bill['idle_usd'])}, "
                     f"over {bill['windows']} window(s), {bill['windows_with_traffic']} with traffic "
                     f"({bill['traffic_share']:.0%}); {_weight(bill)}; {_cached_weight(bill)}")
    return "\n".join(lines)


def _weight(bill: dict) -> str:
    source = bill["output_weight_source"]
    return f"output_weight {bill['output_weight']:g} (configured)" if source == "configured" else source


def _cached_weight(bill: dict) -> str:
    source = bill["cached_input_weight_source"]
    return f"cached_input_weight {bill['cached_input_weight']:g} (configured)" if source == "configured" else source


def _csv(groups: list[dict]) -> str:
    out = io.StringIO()
    if groups:
        writer = csv.DictWriter(out, fieldnames=list(groups[0]))
        writer.writeheader()
        writer.writerows(groups)
    return out.getvalue()


def _usd(value: float | None) -> str:
    return "-" if value is None else f"{value if abs(value) >= 5e-7 else 0.0:.6f}"  # no "-0.000000"
