"""``infer backends check``: probe every backend of a gateway config (health, models, a 1-token request).

Exit status 0 when every backend passes every probe, 1 otherwise, so scripts and CI can gate on it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from core.base import Done, GenerationRequest
from core.settings import SettingsError, config_file

from .common import run_async

if TYPE_CHECKING:  # the remote adapters (aiohttp) and rich load only when `infer backends check` runs
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from adapters.remote.base import RemoteBackend, RemoteSettings

app = typer.Typer(help="Inspect the remote backends of a gateway config (infer serve --config).",
                  no_args_is_help=True, rich_markup_mode=None)


def register(parent: typer.Typer) -> None:
    parent.add_typer(app, name="backends")


@dataclass
class Report:
    """One backend's probes; ``errors`` holds each failed probe's message, in probe order."""

    name: str
    type: str
    base_url: str
    health: str = "-"
    health_ms: float | None = None
    models: str = "-"
    generate: str = "-"
    ttft_ms: float | None = None
    latency_ms: float | None = None
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def detail(self) -> str:
        return (self.errors or self.notes or [""])[0]

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "ok": self.ok, "detail": self.detail}


@app.command("check")
def check(
    config: Path | None = typer.Option(None, "--config", "-c", help="Gateway config file (default: INFER_CONFIG)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per backend, in a list."),
    timeout: float = typer.Option(10.0, "--timeout", min=0.1, help="Seconds allowed for each probe."),
) -> None:
    """Probe each backend: GET health, list its models, stream a 1-token completion."""
    config = config or config_file()
    if config is None:
        raise SettingsError("no config: pass --config FILE or set INFER_CONFIG")
    from gateway.backends_config import load_config

    settings = load_config(config).remote_settings()
    reports = run_async(check_all(settings, timeout))
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in reports], indent=2))
    else:
        _console().print(render(reports))
    if not all(r.ok for r in reports):
        raise typer.Exit(1)


async def check_all(settings: list[RemoteSettings], timeout: float) -> list[Report]:
    return list(await asyncio.gather(*(check_one(capped(s, timeout), timeout) for s in settings)))


def capped(settings: RemoteSettings, limit: float) -> RemoteSettings:
    """The entry with every deadline at most ``limit`` seconds, so a dead backend answers in time."""
    from adapters.remote.base import Timeouts

    t = settings.timeouts
    timeouts = Timeouts(connect=min(t.connect, limit), first_byte=min(t.first_byte, limit),
                        read=min(t.read, limit), total=min(t.total, limit))
    return dataclasses.replace(settings, timeouts=timeouts)


async def check_one(settings: RemoteSettings, timeout: float) -> Report:
    from adapters.remote.registry import create_remote

    report = Report(settings.name, settings.type, settings.base_url)
    try:
        backend = create_remote(settings)
    except Exception as exc:  # a missing adapter module, an unreadable tokenizer
        report.errors.append(f"cannot create the {settings.type} adapter: {exc}")
        return report
    try:
        await asyncio.gather(*(_guard(probe, backend, report, timeout)
                               for probe in (probe_health, probe_models, probe_generate)))
    finally:
        await backend.aclose()
    return report


async def _guard(probe, backend: RemoteBackend, report: Report, timeout: float) -> None:
    """Run one probe; its failure becomes a message on the report, never an exception."""
    name = probe.__name__.removeprefix("probe_")
    try:
        async with asyncio.timeout(timeout + 1):  # the backend's own deadlines normally fire first
            await probe(backend, report)
    except TimeoutError:
        setattr(report, name, "fail")
        report.errors.append(f"{name}: no answer within {timeout:g} s")
    except Exception as exc:
        setattr(report, name, "fail")
        report.errors.append(f"{name}: {backend.to_error(exc).message}")


async def probe_health(backend: RemoteBackend, report: Report) -> None:
    health = await backend.health()
    report.health_ms = health.latency_ms
    report.health = "ok" if health.ok else "fail"
    if not health.ok:
        report.errors.append(f"health: {health.detail}")


async def probe_models(backend: RemoteBackend, report: Report) -> None:
    ids = await backend.models()
    listed = backend.lists(ids)
    report.models = "ok" if listed else "not listed"
    if not listed:  # TGI and llama.cpp ignore the name, OpenAI proxies may not list it: the generate probe decides
        report.notes.append(f"models: '{backend.settings.model}' is not among {', '.join(ids[:5]) or 'no models'}")


async def probe_generate(backend: RemoteBackend, report: Report) -> None:
    request = GenerationRequest(model=backend.settings.name, prompt="Hello",
                                options={"num_predict": 1, "temperature": 0}, stream=True, source="cli")
    start = time.perf_counter()
    done = None
    async for event in backend.stream(request):
        if isinstance(event, Done):
            done = event
    report.latency_ms = (time.perf_counter() - start) * 1000
    if done is None:
        raise RuntimeError("the stream ended without a final event")
    report.ttft_ms = done.timings.ttft * 1000 if done.timings.ttft is not None else None
    report.generate = "ok"


def render(reports: list[Report]) -> Table:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for column in ("name", "type", "base_url", "health", "models", "generate", "latency", "detail"):
        table.add_column(column, overflow="fold", justify="right" if column == "latency" else "left")
    for r in reports:
        detail = r.detail.replace(f"{r.type} backend '{r.name}' at {r.base_url}", "the server")  # the row says it
        table.add_row(Text(r.name), Text(r.type), Text(r.base_url), _mark(r.health), _mark(r.models),
                      _mark(r.generate), _ms(r.latency_ms), Text(_short(detail)))
    return table


def _console() -> Console:
    """Rich's console; one line per backend when piped (rich would wrap at 80 columns)."""
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 200
    return console


def _mark(state: str) -> Text:
    from rich.text import Text

    return Text(state, style={"ok": "green", "fail": "red", "not listed": "yellow"}.get(state, ""))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
