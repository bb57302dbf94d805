"""Tasks: the built-in set is right, files load with file:line errors, exact match, Wilson, McNemar."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from accuracy.target import TargetError
from accuracy.tasks import AbsoluteResult, FEW_SHOT, is_match, load_task, mcnemar_exact, wilson


def test_builtin_basic_has_100_items_and_its_arithmetic_is_right():
    task = load_task("basic")
    assert len(task.items) == 100 and len({i.id for i in task.items}) == 100
    arithmetic = load_task("arithmetic").items
    assert len(arithmetic) == 60 and len(load_task("facts").items) == 40
    ops = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}
    for item in arithmetic:
        a, op, b = re.search(r"What is (\d+) (plus|minus|times) (\d+)\?\nA:$", item.prompt).groups()
        assert item.answers == (str(ops[op](int(a), int(b))),)
    assert all(i.prompt.startswith(FEW_SHOT) for i in task.items)


def test_exact_match_normalises_case_space_and_trailing_punctuation():
    assert is_match(" Paris.\nQ: next", ("Paris",))
    assert is_match("the pacific ocean", ("Pacific", "the Pacific Ocean"))
    assert not is_match("Paris, France", ("Paris",))
    assert not is_match("", ("0",))


def test_a_task_file_with_prompts_questions_and_aliases(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"question": "2+2?", "answer": 4}, {"prompt": "Say hi:", "answer": "hi", "aliases": ["hello"], "id": "x"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    task = load_task(str(path))
    assert task.name == "mine" and [i.id for i in task.items] == ["1", "x"]
    assert task.items[0].prompt.endswith("Q: 2+2?\nA:") and task.items[0].answers == ("4",)
    assert task.items[1].prompt == "Say hi:" and task.items[1].answers == ("hi", "hello")


@pytest.mark.parametrize("line, message", [("{not json", "not JSON"), ('{"question": "q"}', "needs \"answer\"")])
def test_bad_task_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": "a"}\n' + line + "\n")
    with pytest.raises(TargetError, match=rf"bad.jsonl:2: .*{re.escape(message)}"):
        load_task(str(path))


def test_unknown_task():
    with pytest.raises(TargetError, match="neither a built-in task"):
        load_task("no-such-task")


def test_wilson_interval():
    # 8/10 at z = 1.96: centre (0.8 + 0.19208) / 1.38416 = 0.71674, half 1.41602 * 0.16001 = 0.22658
    assert wilson(8, 10) == pytest.approx((0.49016, 0.94332), abs=1e-5)
    low, high = wilson(0, 100)
    assert low == pytest.approx(0.0, abs=1e-15) and high == pytest.approx(0.03699, abs=1e-5)  # z² / (n + z²)


def test_mcnemar_exact():
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 32)  # both tails of Binomial(5, 1/2) at 0 and 5
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 0) == 1.0
    # 1 vs 6 flips: 2 * (1 + 7) / 128
    assert mcnemar_exact(1, 6) == pytest.approx(16 / 128)


def test_flips_between_the_two_sides():
    task = load_task("facts")
    result = AbsoluteResult("facts", task.items[:4])
    result.outputs = {"a": ["Paris", "Tokyo", "Rome", "x"], "b": ["Paris", "Kyoto", "Berlin", "x"]}
    summary = result.summary()
    assert (summary["a"]["correct"], summary["b"]["correct"]) == (2, 2)
    assert (summary["flips"], summary["only_a"], summary["only_b"]) == (2, 1, 1)


def test_the_package_exports_what_it_names():
    import accuracy

    assert all(hasattr(accuracy, name) for name in accuracy.__all__)
    # the engines load when a target opens, not on import (infer compare --help stays fast)
    code = "import sys, accuracy; print(sorted({'torch', 'llama_cpp', 'native_engine'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
