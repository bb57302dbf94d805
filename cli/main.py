"""The ``infer`` command: one Typer app, sub-apps per command group, one error boundary."""

from __future__ import annotations

import os

import typer
from typer.core import TyperGroup

from registry.errors import RegistryError

from . import dev, models, pull, registry_server


class _InferGroup(TyperGroup):
    """Turns the project's errors into one readable line and exit status 1."""

    def invoke(self, ctx):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except RegistryError as exc:
            if os.environ.get("INFER_RAISE_ERRORS"):
                raise
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=_InferGroup,
    name="infer",
    help="Pull, run and serve LLMs locally; route to many backends; measure them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
pull.register(app)
models.register(app)
app.add_typer(registry_server.app, name="registry")
app.add_typer(dev.app, name="dev")


def main() -> None:
    app()
