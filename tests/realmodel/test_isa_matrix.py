"""SmolLM2 at every CPU tier this machine can emulate (tests/isa.py): the C kernels' -march (x86-64, x86-64-v3,
native) crossed with PyTorch's capability (default, avx2, avx512). Each tier, in a child process, answers
"What is the capital of France?" with Paris, greedily, token for token as the exact float32 path does, and
its logits on a chat text stay as close to the exact path's as llama.cpp's on the same file (KL per position,
mean and max). The realmodel tests of speculative decoding and tensor parallelism also run at the AVX2 tier."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests import isa

from .test_logits import PROMPT, TEXT, engine, kl_per_position

pytestmark = pytest.mark.realmodel
CHILD = """
import json, sys, torch
from native_engine import SamplingParams
from native_engine.kernels import cpu_kernels
from native_engine.layers import kernel_check
from tests.realmodel.test_logits import PROMPT, TEXT, engine, kl_per_position
path, reference = sys.argv[1], torch.load(sys.argv[2])
default = engine(path)
ids = default.tokenizer.encode(TEXT, add_bos=False)
kl = kl_per_position(reference, default.model_runner.score(ids))
prompt = default.tokenizer.encode(PROMPT, add_bos=False)
out = default.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24))[0].outputs[0]
print(json.dumps({"answer": out.text, "tokens": list(out.token_ids), "kl_mean": float(kl.mean()),
                  "kl_max": float(kl.max()), "tier": cpu_kernels.tier(),
                  "capability": torch.backends.cpu.get_cpu_capability(), "checks": kernel_check.verdicts()}))
"""


@pytest.fixture(scope="module")
def exact(smollm2_gguf, tmp_path_factory):
    """The exact float32 path's logits on TEXT (saved for the children) and greedy answer tokens."""
    from native_engine import SamplingParams

    f32 = engine(smollm2_gguf, dtype="float32", cpu_int4_matmul=False)
    ids = f32.tokenizer.encode(TEXT, add_bos=False)
    logits = f32.model_runner.score(ids)
    path = tmp_path_factory.mktemp("isa") / "reference.pt"
    torch.save(logits, path)
    prompt = f32.tokenizer.encode(PROMPT, add_bos=False)
    tokens = list(f32.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24))[0].outputs[0].token_ids)
    return path, logits, ids, tokens


@pytest.fixture(scope="module")
def llama_cpp_kl(smollm2_gguf, exact):
    """llama.cpp's KL to the exact path on the same text (the bar each tier must meet)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    _, reference, ids, _ = exact
    llm = llama_cpp.Llama(str(smollm2_gguf), n_ctx=512, logits_all=True, verbose=False)
    try:
        llm.eval(ids)
        theirs = torch.tensor(llm.scores[: len(ids)], dtype=torch.float32)
    finally:
        llm.close()
    kl = kl_per_position(reference, theirs)
    return float(kl.mean()), float(kl.max())


@pytest.mark.parametrize("capability", isa.capabilities())
@pytest.mark.parametrize("march", isa.marches())
def test_smollm2_at_every_tier(march, capability, smollm2_gguf, exact, llama_cpp_kl):
    path, _, _, tokens = exact
    done = subprocess.run([sys.executable, "-c", CHILD, str(smollm2_gguf), str(path)], cwd=isa.ROOT,
                          env=isa.child_env(march, capability), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["capability"].lower() == capability, got
    assert "Paris" in got["answer"], got["answer"]
    assert got["tokens"] == tokens, (got["answer"], got)
    assert all(got["checks"].values()), got["checks"]  # no path of this tier failed its load-time check
    mean, worst = llama_cpp_kl
    assert got["kl_mean"] <= mean and got["kl_max"] <= worst, (got, llama_cpp_kl)


@pytest.mark.skipif("x86-64-v3" not in isa.marches(), reason="no AVX2 on this CPU")
def test_speculative_and_tensor_parallel_at_the_avx2_tier():
    done = isa.run_pytest(["tests/realmodel/test_speculative.py", "tests/realmodel/test_tensor_parallel.py"],
                          isa.child_env("x86-64-v3", "avx2"), timeout=1500)
    tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
    assert done.returncode == 0 and " passed" in tail[-1] and "failed" not in tail[-1], "\n".join(tail)
