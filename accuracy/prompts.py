"""Prompts for the relative comparison: the built-in set, or the user's file.

A ``.jsonl`` file holds one ``{"prompt": ...}`` object a line (prompts may then span lines); any
other file holds one prompt a line (blank lines skipped). Prompts are raw text, continued as they
are: no chat template is applied.
"""

from __future__ import annotations

import json
from pathlib import Path

from .target import TargetError

BUILTIN = Path(__file__).resolve().parent / "data" / "prompts.txt"


def load_prompts(source: str = "builtin") -> list[str]:
    path = BUILTIN if source == "builtin" else Path(source).expanduser()
    if not path.is_file():
        raise TargetError(f"--prompts {source}: no such file (or say builtin)")
    lines = path.read_text(encoding="utf-8").splitlines()
    prompts = [_jsonl_prompt(line, f"{path}:{n}") for n, line in enumerate(lines, 1) if line.strip()] \
        if path.suffix == ".jsonl" else [line for line in lines if line.strip()]
    if not prompts:
        raise TargetError(f"{path}: no prompts")
    return prompts


def _jsonl_prompt(line: str, where: str) -> str:
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise TargetError(f"{where}: not JSON: {exc}") from None
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
        raise TargetError(f"{where}: each line needs a non-empty \"prompt\" string")
    return row["prompt"]
