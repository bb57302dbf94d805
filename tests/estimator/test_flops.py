"""estimate.md §1: the FLOPs method reproduces the source documents' Qwen2.5-32B case from its config."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from estimator import ModelShape, decode_flops_per_token, parameter_count, prefill_flops

QWEN25_32B = {"hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 40,
              "num_key_value_heads": 8, "vocab_size": 152064}

# By hand: V·h = 778,567,680; per layer 3·h·i = 424,673,280, 2·h² = 52,428,800, 2·h²·kv/a = 10,485,760.
PARAMS = 778_567_680 + 64 * (424_673_280 + 52_428_800 + 10_485_760)
# Prefill per layer, p = 1024: 4·1.2·p·h² = 128,849,018,880; 4·p²·h = 21,474,836,480; 6·p·h·i = 869,730,877,440.
PREFILL = 64 * (128_849_018_880 + 21_474_836_480 + 869_730_877_440)
# Decode per token per layer, o = 1024: 4·1.2·h² = 125,829,120; 6·h·i = 849,346,560; 4·(1024 + 512.5)·h = 31,467,520.
DECODE = 64 * (125_829_120 + 849_346_560 + 31_467_520)


def test_worked_case_from_the_formulas():
    m = ModelShape("qwen2.5-32b", 5120, 27648, 64, 40, 8, 152064)
    assert parameter_count(m) == PARAMS == 31_984_189_440
    assert prefill_flops(m, 1024) == PREFILL == 65_283_502_899_200
    assert decode_flops_per_token(m, 1024, 1024) == DECODE == 64_425_164_800
    assert PREFILL / 148e12 == pytest.approx(0.4411, abs=1e-4)       # TTFT ≈ 0.44 s at 148 TFLOP/s
    assert 148e12 / DECODE == pytest.approx(2297.2, abs=0.1)          # ≈ 2,297 tok/s at batch 1


def test_cli_reproduces_the_case_at_full_utilisation(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_32B))
    result = CliRunner().invoke(app, ["estimate", str(tmp_path / "config.json"), "--device", "doc-device",
                                      "--peak-tflops", "148", "--bandwidth-gbs", "1000", "--memory-gb", "80",
                                      "--mfu", "1", "--input-tokens", "1024", "--output-tokens", "1024", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["parameters"] == PARAMS and report["prefill_flops"] == PREFILL
    assert report["decode_flops_per_token"] == DECODE
    assert report["ttft_ms"] == pytest.approx(1000 * PREFILL / 148e12)
    assert report["flops_method_tok_s"] == pytest.approx(148e12 / DECODE)
    # The roofline adds what the FLOPs method misses: at batch 1 the 64 GB of bf16 weights bind.
    assert report["binds"] == "bandwidth"
    assert report["tpot_memory_ms"] == pytest.approx(1000 * (2 * PARAMS + 1536.5 * 262_144) / (1000e9 * 0.7))


def test_rule_of_thumb_is_two_flops_per_parameter(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_32B))
    result = CliRunner().invoke(app, ["estimate", str(tmp_path), "--device", "h100", "--input-tokens", "100",
                                      "--batch", "4", "--json"])
    report = json.loads(result.output)
    assert report["prefill_flops_rule_of_thumb"] == 2 * 4 * 100 * PARAMS
    assert report["decode_flops_rule_of_thumb"] == 2 * 4 * PARAMS
