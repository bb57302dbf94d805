"""``infer compare``: is B as accurate as A? Relative accuracy (KL along A's greedy answers) and
absolute accuracy (an exact-match task), between engines, quantizations or servers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from core.settings import ClientSettings


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_cmd)


def compare_cmd(
    a: str = typer.Option(..., "--a", help="Reference: MODEL@native|llamacpp[?opt=v&...] or URL#MODEL "
                                           "(http://host:port#m = OpenAI API, http://host:port/api#m = Ollama API)."),
    b: str = typer.Option(..., "--b", help="The target compared with A (same forms)."),
    prompts: str = typer.Option("builtin", "--prompts", help="builtin, a text file (one prompt a line), "
                                                              "a .jsonl file ({\"prompt\": ...}), or none."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, max=4096, help="Tokens A generates per prompt."),
    top_logprobs: int = typer.Option(20, "--top-logprobs", min=1, max=100,
                                     help="k of the top-k log-probabilities a server returns (most cap it at 20)."),
    task: str = typer.Option(None, "--task", help="Absolute accuracy too: basic, arithmetic, facts, or a JSONL file."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole result as JSON."),
    out: Path = typer.Option(None, "--out", help="Write compare.json, report.txt and kl.png into DIR."),
) -> None:
    """Greedy answers from A teacher-forced on B: KL(A‖B) per token, agreement, first divergence; with
    --task, each side's accuracy with a 95 % Wilson interval and the items that flip."""
    from accuracy import TargetError, run_compare
    from accuracy.report import absolute_lines, header_lines, relative_lines, write_png

    from .common import get_store

    def progress(done: int, total: int) -> None:
        if not as_json and sys.stderr.isatty():
            typer.echo(f"\r  scored {done}/{total} answers on B", err=True, nl=done == total)

    try:
        comparison, vocab = run_compare(a, b, prompts=None if prompts == "none" else prompts,
                                        max_tokens=max_tokens, top_k=top_logprobs, task=task, store=get_store(),
                                        on_prompt=progress)
    except TargetError as exc:
        if ClientSettings.from_env().raise_errors:
            raise
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from None
    lines = header_lines(comparison)
    if comparison.relative:
        lines += [""] + relative_lines(comparison.relative, vocab)
    if comparison.absolute:
        lines += [""] + absolute_lines(comparison.absolute)
    document = comparison.as_dict()
    if out is not None:
        _write(out, document, lines, comparison)
        lines += ["", f"wrote {out / 'compare.json'}, {out / 'report.txt'}"
                  + (f", {out / 'kl.png'}" if comparison.relative else "")]
    typer.echo(json.dumps(document, indent=2) if as_json else "\n".join(lines))


def _write(out: Path, document: dict, lines: list[str], comparison) -> None:
    from accuracy.report import write_png

    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(document, indent=2) + "\n")
    (out / "report.txt").write_text("\n".join(lines) + "\n")
    if comparison.relative:
        write_png(comparison.relative, out / "kl.png", f"A = {comparison.a.spec}   B = {comparison.b.spec}")
