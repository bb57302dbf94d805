"""Local model management: ``list``, ``show``, ``rm``, ``cp``, ``create``."""

from __future__ import annotations

from pathlib import Path

import typer

from core.options import check_parameters
from registry.create import create_model
from registry.details import ModelDetails, load_details
from registry.errors import ModelfileError
from registry.modelfile import parse_modelfile
from registry.names import parse_name

from .common import get_store
from .format import human_bytes, human_time_ago, table
from .progress import ProgressRenderer


def register(app: typer.Typer) -> None:
    app.command("list")(list_cmd)
    app.command("ls", hidden=True)(list_cmd)
    app.command("show")(show_cmd)
    app.command("rm")(rm_cmd)
    app.command("cp")(cp_cmd)
    app.command("create")(create_cmd)


def list_cmd() -> None:
    """List local models (newest first)."""
    rows = [["NAME", "ID", "SIZE", "MODIFIED"]]
    for m in get_store().list_models():
        rows.append([m.name.display, m.id, human_bytes(m.size), human_time_ago(m.modified)])
    typer.echo(table(rows))


def show_cmd(model: str,
             modelfile: bool = typer.Option(False, "--modelfile", help="Show the Modelfile."),
             template: bool = typer.Option(False, "--template", help="Show the chat template."),
             parameters: bool = typer.Option(False, "--parameters", help="Show the parameters."),
             system: bool = typer.Option(False, "--system", help="Show the system message."),
             license_: bool = typer.Option(False, "--license", help="Show the license.")) -> None:
    """Show a model's architecture, size, context, quantization, template, parameters, license."""
    store = get_store()
    d = load_details(store, store.resolve(model))
    if modelfile:
        typer.echo(d.modelfile(), nl=False)
    elif template:
        typer.echo(d.chat_template or "")
    elif parameters:
        typer.echo(_parameter_lines(d.parameters))
    elif system:
        typer.echo(d.system or "")
    elif license_:
        typer.echo("\n".join(d.licenses))
    else:
        typer.echo(render_show(d))


def render_show(d: ModelDetails) -> str:
    out = ["  Model"]
    info = d.gguf
    facts = [("architecture", info.architecture if info else d.config.get("model_family", "")),
             ("parameters", info.parameter_size if info else d.config.get("model_type", "")),
             ("context length", str(info.context_length or "") if info else ""),
             ("embedding length", str(info.embedding_length or "") if info else ""),
             ("quantization", info.file_type if info else d.config.get("file_type", ""))]
    out += [f"    {k:<20}{v}" for k, v in facts if v]
    out += _section("Adapter", _adapter_lines(d))
    out += _section("Chat template", (d.chat_template or "").splitlines()[:6])
    out += _section("Parameters", _parameter_lines(d.parameters).splitlines())
    out += _section("System", (d.system or "").splitlines()[:4])
    license_lines = "\n".join(d.licenses).strip().splitlines()[:2]
    out += _section("License", license_lines)
    return "\n".join(out) + "\n"


def _adapter_lines(d: ModelDetails) -> list[str]:
    """The LoRA adapter layer: its type, alpha, size and digest."""
    if d.adapter_path is None:
        return []
    from registry.gguf_info import read_gguf_info

    meta = read_gguf_info(d.adapter_path).metadata
    facts = [("type", meta.get("adapter.type", "")), ("alpha", f"{meta.get('adapter.lora.alpha', 0):g}"),
             ("size", human_bytes(d.adapter_path.stat().st_size)), ("digest", d.adapter_path.name[:19])]
    return [f"{k:<20}{v}" for k, v in facts]


def _section(title: str, lines: list[str]) -> list[str]:
    return ["", f"  {title}", *(f"    {line}" for line in lines)] if lines else []


def _parameter_lines(params: dict) -> str:
    lines, width = [], max((len(k) for k in params), default=0)
    for key, value in params.items():
        for item in value if isinstance(value, list) else [value]:
            shown = f'"{item}"' if isinstance(item, str) else str(item).lower() if isinstance(item, bool) else str(item)
            lines.append(f"{key:<{width}} {shown}")
    return "\n".join(lines)


def rm_cmd(models: list[str] = typer.Argument(..., help="Models to remove.")) -> None:
    """Remove models, then every blob no remaining model references."""
    store = get_store()
    for model in models:
        store.remove(store.resolve(model))
        typer.echo(f"deleted '{model}'")


def cp_cmd(source: str, destination: str) -> None:
    """Copy a model under a new name (the blobs are shared)."""
    store = get_store()
    store.copy(store.resolve(source), parse_name(destination))
    typer.echo(f"copied '{source}' to '{destination}'")


def create_cmd(model: str,
               file: Path = typer.Option(Path("Modelfile"), "--file", "-f", help="Path to the Modelfile.")) -> None:
    """Create a model from a Modelfile (FROM a GGUF file or an existing model)."""
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelfileError(f"cannot read Modelfile {file}: {exc.strerror}") from None
    mf = parse_modelfile(text)
    try:
        check_parameters(mf.parameters)
    except ValueError as exc:
        raise ModelfileError(f"{file}: {exc}") from None
    name = parse_name(model)
    with ProgressRenderer() as renderer:
        create_model(get_store(), name, mf, file.resolve().parent, renderer)
