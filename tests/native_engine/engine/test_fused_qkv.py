"""The CUDA path of the attention block on the CPU: QKV without bias, then `qkv_rope_cache` (bias, rotary, cache
write in one call; its torch reference here, its Triton kernel in tests/native_engine/kernels) and attention on
the cache as written, with decode-only steps taking the paged kernel's output as is: the same tokens as the CPU
path. The module path runs every step (the C decode stack is switched off)."""

from __future__ import annotations

from .helpers import greedy, module_path, on_cuda_path, seeded, token_ids


def test_fused_attention_block_gives_the_cpu_paths_tokens(make_engine, prompts, monkeypatch):
    batch = prompts([5, 21, 40, 9], seed=61)
    params = [greedy(12), greedy(12), seeded(12, seed=2, top_k=40), greedy(6)]
    expected = token_ids(module_path(make_engine()).generate(batch, params))
    calls = on_cuda_path(monkeypatch, "qkv_rope_cache")
    assert token_ids(module_path(make_engine()).generate(batch, params)) == expected
    assert len(calls) > 20  # every layer of every step went through it
