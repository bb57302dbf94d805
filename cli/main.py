"""The ``infer`` command: one Typer app, sub-apps per command group, one error boundary."""

from __future__ import annotations

import typer
from typer.core import TyperGroup

from core.errors import BackendError
from core.settings import ClientSettings, SettingsError
from registry.errors import RegistryError

from . import backends, bench, compare, cost, dev, estimate, keys, models, ps, pull, registry_server, routes, run, serve, usage


class _InferGroup(TyperGroup):
    """Turns the project's errors into one readable line and exit status 1."""

    def invoke(self, ctx):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except (RegistryError, BackendError, SettingsError) as exc:
            if ClientSettings.from_env().raise_errors:
                raise
            typer.echo(f"Error: {_message(exc)}", err=True)
            raise typer.Exit(1) from None


def _message(exc: Exception) -> str:
    return exc.message if isinstance(exc, BackendError) else str(exc)


app = typer.Typer(
    cls=_InferGroup,
    name="infer",
    help="Pull, run and serve LLMs locally; route to many backends; measure them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context,
          version: bool = typer.Option(False, "--version", "-v", help="Show the version (and the running server's).")) -> None:
    if version:
        version_lines()
        raise typer.Exit()
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit()


def version_lines() -> None:
    """As ``ollama -v``: the server's version, and the client's when it differs (or no server answers)."""
    from gateway.version import VERSION

    from .client import find_server

    found = find_server()
    if found is None:
        typer.echo("Warning: could not connect to a running infer serve")
    else:
        typer.echo(f"infer version is {found[1]}")
    if found is None or found[1] != VERSION:
        typer.echo(f"Warning: client version is {VERSION}")


pull.register(app)
models.register(app)
ps.register(app)
serve.register(app)
usage.register(app)
run.register(app)
backends.register(app)
routes.register(app)
estimate.register(app)
compare.register(app)
app.add_typer(registry_server.app, name="registry")
app.add_typer(dev.app, name="dev")
app.add_typer(bench.app, name="bench")
app.add_typer(cost.app, name="cost")
app.add_typer(keys.app, name="keys")


def main() -> None:
    app()
