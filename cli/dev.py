"""`infer dev`: developer tools (deterministic test models, the cached real model)."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="Developer tools.", no_args_is_help=True)

FORMATS = ("gguf", "hf")
DTYPES = {"gguf": ("f32", "f16", "q8_0"), "hf": ("f32", "f16", "bf16")}


@app.callback()
def _dev() -> None:
    """Developer tools."""


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _check_choice(value: str, allowed: tuple[str, ...], hint: str) -> str:
    if value not in allowed:
        raise typer.BadParameter(f"{value!r} is not one of: {', '.join(allowed)}", param_hint=hint)
    return value


def _written_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]


@app.command("make-model")
def make_model(
    preset: str = typer.Option("tiny-qwen2", "--preset", help="Model shape preset."),
    fmt: str = typer.Option("gguf", "--format", help="Output format: gguf or hf."),
    dtype: str = typer.Option("f32", "--dtype", help="gguf: f32|f16|q8_0; hf: f32|f16|bf16."),
    seed: int = typer.Option(0, "--seed", min=0, help="Weight seed; same seed, same bytes."),
    out: Path | None = typer.Option(None, "--out", help="Output file (gguf) or directory (hf)."),
) -> None:
    """Write a small deterministic model with random weights (for tests and benchmarks)."""
    from registry.modelbuilder import PRESETS, build_gguf, build_hf

    _check_choice(preset, tuple(PRESETS), "--preset")
    _check_choice(fmt, FORMATS, "--format")
    _check_choice(dtype, DTYPES[fmt], "--dtype")
    spec = PRESETS[preset]
    target = out or Path(f"{preset}-{dtype}.gguf" if fmt == "gguf" else f"{preset}-{dtype}-hf")
    build = build_gguf if fmt == "gguf" else build_hf
    try:
        path = build(target, spec, dtype=dtype, seed=seed)
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    files = _written_files(path)
    for f in files:
        typer.echo(f"{f}  {_human(f.stat().st_size)}")
    if len(files) > 1:
        typer.echo(f"total  {_human(sum(f.stat().st_size for f in files))}")


@app.command("fetch-model")
def fetch_model(
    offline: bool = typer.Option(False, "--offline", help="Only report the cached file; never download."),
) -> None:
    """Download SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) once and print its cached path."""
    from registry.realmodels import FetchError, fetch_smollm2

    try:
        path = fetch_smollm2(offline=offline)
    except (FetchError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{path}  {_human(path.stat().st_size)}")


@app.command("make-lora")
def make_lora(
    preset: str = typer.Option("tiny-qwen2", "--preset", help="Shape of the base model (a make-model preset)."),
    base: Path | None = typer.Option(None, "--base", help="A GGUF model to make it for (instead of --preset)."),
    rank: int = typer.Option(8, "--rank", "-r", min=1, help="LoRA rank r."),
    alpha: float | None = typer.Option(None, "--alpha", help="lora_alpha (default: r, a scale of 1)."),
    targets: str | None = typer.Option(None, "--targets", help="Comma-separated target modules (default: "
                                       "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)."),
    fmt: str = typer.Option("gguf", "--format", help="gguf (llama.cpp) or peft (adapter_config.json + safetensors)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Weight seed; same seed, same bytes."),
    out: Path | None = typer.Option(None, "--out", help="Output file (gguf) or directory (peft)."),
) -> None:
    """Write a random rank-r LoRA adapter for a test model (or any llama/qwen2 GGUF with --base)."""
    from registry.errors import RegistryError
    from registry.modelbuilder import PRESETS, LoraSpec, build_lora, spec_from_gguf
    from registry.modelbuilder.lora_out import TARGETS

    _check_choice(fmt, ("gguf", "peft"), "--format")
    try:
        spec = spec_from_gguf(base) if base is not None else PRESETS[_check_choice(preset, tuple(PRESETS), "--preset")]
        modules = tuple(targets.split(",")) if targets else TARGETS
        lora = LoraSpec(rank=rank, alpha=float(alpha or rank), targets=modules, seed=seed)
        target = out or Path(f"{spec.name}-lora-r{rank}" + (".gguf" if fmt == "gguf" else ""))
        path = build_lora(target, spec, lora, fmt=fmt)
    except (OSError, ValueError, KeyError, RegistryError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    for f in _written_files(path):
        typer.echo(f"{f}  {_human(f.stat().st_size)}")
