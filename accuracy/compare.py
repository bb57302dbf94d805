"""One comparison of two targets, end to end: open both, the relative part, the task, the result."""

from __future__ import annotations

import time
from collections.abc import Callable

from .prompts import load_prompts
from .relative import compare_relative
from .report import Comparison
from .target import Target
from .targets import open_target
from .tasks import compare_absolute, load_task


def run_compare(a_spec: str, b_spec: str, *, prompts: str | None = "builtin", max_tokens: int = 64,
                top_k: int = 20, task: str | None = None, store=None,
                on_prompt: Callable[[int, int], None] | None = None) -> tuple[Comparison, int | None]:
    """Compare B with A; returns the comparison and the vocabulary size when both are engines.
    ``prompts=None`` skips the relative part, ``task=None`` the absolute one."""
    prompt_list = load_prompts(prompts) if prompts else None
    loaded_task = load_task(task) if task else None
    started = time.perf_counter()
    a = open_target(a_spec, store)
    try:
        b = open_target(b_spec, store)
        try:
            comparison = _run(a, b, prompt_list, loaded_task, max_tokens, top_k, on_prompt)
        finally:
            b.close()
    finally:
        a.close()
    comparison.seconds = time.perf_counter() - started
    return comparison, len(a.vocab) if a.vocab is not None and a.vocab.same_as(b.vocab) else None


def _run(a: Target, b: Target, prompts, task, max_tokens: int, top_k: int, on_prompt) -> Comparison:
    settings = {"prompts": len(prompts) if prompts else 0, "max_tokens": max_tokens, "top_logprobs": top_k,
                "task": task.name if task else None}
    comparison = Comparison(a.info, b.info, settings)
    if prompts:
        comparison.relative = compare_relative(a, b, prompts, max_tokens=max_tokens, top_k=top_k, on_prompt=on_prompt)
    if task:
        comparison.absolute = compare_absolute(a, b, task)
    return comparison
