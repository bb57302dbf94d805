"""``infer compare`` on SmolLM2-135M (Q4_1): the native engine's default path against its exact f32
path gives the bench's figure (mean KL ~4e-7, bench/native_smollm2.py), the same greedy tokens, and
the top-20 estimate within a factor of two of the exact KL."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app

pytestmark = pytest.mark.realmodel


def test_default_path_against_the_exact_f32_path(smollm2_gguf, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is Paris. It is known for\ndef fibonacci(n):\n")
    result = CliRunner().invoke(app, ["compare", "--a", f"{smollm2_gguf}@native?dtype=float32&cpu_int4_matmul=false",
                                      "--b", f"{smollm2_gguf}@native", "--prompts", str(prompts),
                                      "--max-tokens", "32", "--json"])
    assert result.exit_code == 0, result.output
    relative = json.loads(result.stdout)["relative"]
    summary = relative["summary"]
    assert relative["method"] == "exact" and summary["positions"] == 64
    assert 1e-8 < summary["kl"]["mean"] < 2e-6, summary["kl"]
    assert summary["same_top"] == 1.0
    assert 0.5 < summary["topk_error"]["mean_ratio"] <= 1.0, summary["topk_error"]
