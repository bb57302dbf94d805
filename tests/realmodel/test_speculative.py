"""Speculative decoding on SmolLM2-135M-Instruct (Q4_1, the C decode kernels): the greedy tokens with and
without it are the same, for n-gram proposals (every match verified: verify rows of 2..5 query tokens
through llama_decode_rows and llama_decode_batch) and for the model as its own draft (every draft
accepted); sampled rows run to their length."""

from __future__ import annotations

import pytest

from native_engine import LLMEngine, SamplingParams

pytestmark = pytest.mark.realmodel

TEXT = ("The old harbour town sits at the mouth of a wide, slow river. For most of its history the town lived "
        "from fishing and from the small boatyards along the eastern quay, where wooden hulls were built by hand "
        "untill the nineteen-sixties. Today only one yard is left, and it repairs more yachts than it builds "
        "fishing boats.")
PROMPTS = [f"<|im_start|>user\nCorrect the spelling in this text:\n\n{TEXT}<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWrite a short story about a dragon.<|im_end|>\n<|im_start|>assistant\n"]
ENGINE = dict(max_num_seqs=8, max_model_len=1024, max_num_batched_tokens=256)


@pytest.fixture(scope="module")
def plain(smollm2_gguf):
    engine = LLMEngine.from_model(str(smollm2_gguf), **ENGINE)
    return [o.outputs[0].token_ids for o in engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=64))]


@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 4])
def test_ngram_greedy_equal(smollm2_gguf, plain, k):
    engine = LLMEngine.from_model(str(smollm2_gguf), speculative=f"ngram:k={k},adaptive=off", **ENGINE)
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=64))
    assert [o.outputs[0].token_ids for o in outs] == plain
    stats = engine.spec_decode_stats()
    assert stats["num_accepted_tokens"] > 0, stats
    one = engine.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=64))[0]  # batch 1
    assert one.outputs[0].token_ids == plain[0]


@pytest.mark.slow
def test_own_draft_accepts_everything(smollm2_gguf, plain):
    engine = LLMEngine.from_model(str(smollm2_gguf), speculative=f"draft:{smollm2_gguf}:k=4,adaptive=off", **ENGINE)
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=64))
    assert [o.outputs[0].token_ids for o in outs] == plain
    stats = engine.spec_decode_stats()
    assert stats["num_draft_tokens"] > 0 and stats["acceptance_rate"] == 1.0, stats


@pytest.mark.slow
def test_sampled_rows(smollm2_gguf):
    engine = LLMEngine.from_model(str(smollm2_gguf), speculative="ngram:k=4,adaptive=off", **ENGINE)
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0.7, top_p=0.9, max_tokens=48, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in outs] == [48, 48]
    assert engine.spec_decode_stats()["num_drafts"] > 0


@pytest.mark.slow
def test_the_bench_runs(smollm2_gguf, tmp_path):
    """bench/speculative.py --quick: every pass, the JSON it writes (a smoke run; the figures are the bench's)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "spec.json"
    proc = subprocess.run([sys.executable, str(root / "bench" / "speculative.py"), "--quick", "--runs", "1",
                           "--no-draft", "--json", str(out)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(root)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for key in ("edit", "summary", "story", "concurrent16"):
        assert res[key]["greedy_equal"] and res[key]["plain_tok_s"] > 0 and res[key]["spec_tok_s"] > 0
    assert "goal >= 1.60" in proc.stdout
