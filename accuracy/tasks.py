"""Absolute accuracy: exact-match tasks answered greedily by each target, with a confidence interval.

A task is JSONL, one item a line: ``{"question": ..., "answer": ...}`` (the question is put after a
short few-shot block, ``Q: ...\\nA:``), or ``{"prompt": ..., "answer": ...}`` (the prompt is sent as
it is); optional ``"aliases": [...]`` (other accepted answers), ``"id"``, ``"category"``. The answer is
the first line of the greedy continuation (at most ``MAX_ANSWER_TOKENS`` tokens); it matches when,
lower-cased, with surrounding spaces and trailing punctuation removed, it equals the answer or an
alias. Built-in: ``basic`` (100 items written for this project: 60 arithmetic, 40 general facts),
and its halves ``arithmetic`` and ``facts``.

Accuracy comes with a 95 % Wilson score interval; items that one target gets right and the other
wrong ("flips") with McNemar's exact test of whether the two accuracies differ.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from .target import Target, TargetError

DATA = Path(__file__).resolve().parent / "data"
BUILTIN = {"basic": None, "arithmetic": "arithmetic", "facts": "facts"}  # name -> category filter
MAX_ANSWER_TOKENS = 16
Z95 = 1.959963984540054
FEW_SHOT = ("Q: What is 3 plus 4?\nA: 7\n\n"
            "Q: What is the capital of Italy?\nA: Rome\n\n"
            "Q: How many wheels does a bicycle have?\nA: 2\n\n")


@dataclass(frozen=True, slots=True)
class Item:
    id: str
    prompt: str
    answers: tuple[str, ...]
    category: str | None = None


@dataclass(slots=True)
class Task:
    name: str
    items: list[Item]


def load_task(name_or_path: str) -> Task:
    """A built-in task by name, or a JSONL file."""
    if name_or_path in BUILTIN:
        category = BUILTIN[name_or_path]
        task = _read(DATA / "basic.jsonl", name_or_path)
        return Task(name_or_path, [i for i in task.items if category is None or i.category == category])
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise TargetError(f"--task {name_or_path}: neither a built-in task ({', '.join(BUILTIN)}) nor a file")
    return _read(path, path.stem)


def _read(path: Path, name: str) -> Task:
    items = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            items.append(_item(line, f"{path}:{line_no}", len(items)))
    if not items:
        raise TargetError(f"{path}: no items")
    return Task(name, items)


def _item(line: str, where: str, index: int) -> Item:
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise TargetError(f"{where}: not JSON: {exc}") from None
    if not isinstance(row, dict) or "answer" not in row or not ({"prompt", "question"} & row.keys()):
        raise TargetError(f"{where}: an item needs \"answer\" and \"question\" (or \"prompt\")")
    prompt = row["prompt"] if "prompt" in row else f"{FEW_SHOT}Q: {row['question']}\nA:"
    aliases = row.get("aliases") or []
    if not isinstance(prompt, str) or not isinstance(aliases, list):
        raise TargetError(f"{where}: \"prompt\"/\"question\" must be a string and \"aliases\" a list")
    answers = tuple(str(a) for a in [row["answer"], *aliases])
    return Item(str(row.get("id", index + 1)), prompt, answers, row.get("category"))


def normalize(text: str) -> str:
    first = text.strip().split("\n", 1)[0] if text.strip() else ""
    return re.sub(r"\s+", " ", first.strip().strip(".,;:!?\"'").strip()).lower()


def is_match(output: str, answers: tuple[str, ...]) -> bool:
    got = normalize(output)
    return any(got == normalize(a) for a in answers)


def wilson(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95 % by default)."""
    if n == 0:
        return math.nan, math.nan
    p = correct / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: the binomial test of the flips against a fair coin."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(slots=True)
class AbsoluteResult:
    task: str
    items: list[Item]
    outputs: dict[str, list[str]] = field(default_factory=dict)  # side ("a"/"b") -> answers

    def correct(self, side: str) -> list[bool]:
        return [is_match(out, item.answers) for out, item in zip(self.outputs[side], self.items, strict=True)]

    def summary(self) -> dict:
        a, b = self.correct("a"), self.correct("b")
        only_a = sum(x and not y for x, y in zip(a, b, strict=True))
        only_b = sum(y and not x for x, y in zip(a, b, strict=True))
        return {"task": self.task, "items": len(self.items), "a": _side(a), "b": _side(b),
                "flips": only_a + only_b, "only_a": only_a, "only_b": only_b,
                "mcnemar_p": mcnemar_exact(only_a, only_b)}

    def as_dict(self) -> dict:
        a, b = self.correct("a"), self.correct("b")
        rows = [{"id": item.id, "answers": list(item.answers), "a": out_a, "b": out_b, "a_correct": ca,
                 "b_correct": cb} for item, out_a, out_b, ca, cb in
                zip(self.items, self.outputs["a"], self.outputs["b"], a, b, strict=True)]
        return {"summary": self.summary(), "items": rows}


def _side(correct: list[bool]) -> dict:
    n, hits = len(correct), sum(correct)
    low, high = wilson(hits, n)
    return {"correct": hits, "accuracy": hits / n if n else math.nan, "ci95": [low, high]}


def answer(target: Target, items: list[Item]) -> list[str]:
    """Each item's answer: the first line of the target's greedy continuation."""
    answers = target.generate_greedy([i.prompt for i in items], MAX_ANSWER_TOKENS, 1, stop=["\n"])
    return [a.text.split("\n", 1)[0].strip() for a in answers]


def compare_absolute(a: Target, b: Target, task: Task) -> AbsoluteResult:
    result = AbsoluteResult(task.name, task.items)
    result.outputs = {"a": answer(a, task.items), "b": answer(b, task.items)}
    return result
