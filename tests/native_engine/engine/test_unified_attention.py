"""`EngineConfig.unified_attention` on the CPU: steps with prefill chunks send every row (decodes, fresh prompts,
chunks after a cached prefix) through one unified attention call per layer, here the Triton kernel itself under
TRITON_INTERPRET, and give the per-chunk path's tokens. On CUDA the same inputs reach the compiled kernel
(tests/native_engine/test_cuda_graph.py has the GPU check)."""

from __future__ import annotations

import importlib

import pytest

from native_engine.layers import attention

kernel = importlib.import_module("native_engine.kernels.unified_attention")  # the package re-exports the function

from .helpers import greedy, module_path, seeded, token_ids


@pytest.fixture
def unified_calls(monkeypatch):
    """Each unified call's (rows, max query length), with the interpreted Triton kernel doing the work."""
    pytest.importorskip("triton")
    if not kernel.triton_interpreted():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set (or a GPU is present)")
    calls = []

    def traced(q, k_cache, v_cache, tables, query_start, seq_lens, scale, max_query_len):
        calls.append((len(seq_lens), max_query_len))
        return kernel.unified_attention_triton(q, k_cache, v_cache, tables, query_start, seq_lens, scale,
                                               max_query_len)

    monkeypatch.setattr(attention, "unified_attention", traced)
    return calls


def unified(engine):
    engine.model_runner.inputs.unified = True
    return engine


def test_mixed_steps_in_one_kernel_give_the_per_chunk_paths_tokens(make_engine, prompts, unified_calls):
    shared = prompts([40], seed=5)[0]
    batch = prompts([5, 37, 3, 21], seed=61) + [shared + p for p in prompts([9, 30], seed=6)]
    params = [greedy(10), greedy(10), seeded(10, seed=2, top_k=40), greedy(6), greedy(8), greedy(8)]
    settings = {"max_num_batched_tokens": 24, "max_num_seqs": 4}  # chunked prompts beside decoding rows

    def run(engine):
        engine.generate([shared], greedy(2))  # the shared prefix's blocks in the cache
        return token_ids(engine.generate(batch, params))

    expected = run(module_path(make_engine(**settings)))
    assert not unified_calls  # off on the CPU unless asked for
    assert run(unified(module_path(make_engine(**settings)))) == expected
    assert unified_calls, "no step went through the unified kernel"
    assert any(rows > 1 and longest > 1 for rows, longest in unified_calls)  # decodes and a chunk in one call


def test_off_by_default_and_never_on_the_cpu_unless_forced(make_engine):
    assert make_engine().model_runner.inputs.unified is False
    engine = make_engine(unified_attention=True)
    assert engine.config.unified_attention is True
    assert engine.model_runner.inputs.unified is False  # CPU: the bit-identical per-chunk prefill stays
