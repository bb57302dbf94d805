"""bench/native_gpu.py --quick: the GPU bench's whole path (model directory, dummy weights, every workload on
our engine and on transformers, the report and its JSON) on a tiny model on the CPU, so it never rots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_bench_quick_runs_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "native_gpu.py"), "--quick", "--speculative", "--fused", "--unified",
                           "--json", str(out)],
                          capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["device"] == "CPU" and res["copy_bandwidth"] > 0
    ours, hf = res["models"]["tiny"]["ours"], res["models"]["tiny"]["hf"]
    for key in ("uniform_greedy", "uniform_sampled", "mixed_greedy", "mixed_sampled"):
        assert ours[key]["tok_s"] > 0 and hf[key]["tok_s"] > 0 and ours[key]["steps"] > 1
    assert 0 < ours["single_greedy"]["mbu"] < 1 and ours["single_sampled"]["decode_tok_s"] > 0
    assert len(ours["uniform_greedy"]["runs_tok_s"]) == len(hf["uniform_greedy"]["runs_tok_s"]) == 2  # repeats
    assert "ahead_failed" not in ours and "unified_failed" not in ours and "ours_error" not in res["models"]["tiny"]
    profile = ours["profile"]
    for key in ("decode_b1_greedy", "decode_b1_sampled", "decode_b64_greedy", "decode_b64_sampled"):
        p = profile[key]
        assert p["wall_us"] > 0 and p["busy_us"] > 0 and p["kernels_per_step"] > 0 and len(p["top"]) == 8, p
    mixed = profile["mixed"]
    assert mixed["chunks"] > 1 and mixed["decodes"] > 1, mixed
    for path in ("per_chunk", "unified"):
        assert mixed[path]["wall_us"] > 0 and mixed[path]["kernels_per_step"] > 0 and mixed[path]["top"], mixed[path]
    assert "mixed step (" in proc.stdout
    assert {row["name"] for row in profile["gemv"]} >= {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    assert "sampled / greedy" in proc.stdout and "ours/hf" in proc.stdout and "kernels/step" in proc.stdout
    spec = res["speculative"]
    assert "error" not in spec, spec
    assert spec["greedy_equal"] and spec["plain_tok_s"] > 0 and spec["spec_tok_s"] > 0
    assert "speculative ngram:k=4, batch 1 greedy" in proc.stdout
    fused = res["fused"]
    assert "error" not in fused, fused
    assert fused["fused_active"] is False and fused["same_tokens"] == 1.0  # on the CPU both run the module path
    assert fused["fused_tok_s"] > 0 and fused["unfused_tok_s"] > 0
    assert "fused decode (kernels/fused_gemv.py), batch 1 greedy" in proc.stdout
    uni = res["unified"]
    assert "error" not in uni, uni
    assert uni["unified"]["tok_s"] > 0 and uni["per_chunk"]["tok_s"] > 0 and uni["unified"]["ttft_ms_p50"] > 0
    assert "unified attention, mixed greedy" in proc.stdout
