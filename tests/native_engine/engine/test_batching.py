"""Greedy outputs equal llama.cpp's, and do not depend on batching or on how prompts are chunked."""

from __future__ import annotations

import itertools

import pytest
import torch

from native_engine import LLMEngine

from .helpers import assert_all_blocks_free, greedy, token_ids


def _llama_cpp_greedy(llm, prompt: list[int], max_tokens: int) -> list[int]:
    return list(itertools.islice(llm.generate(prompt, top_k=1, temp=0.0, reset=True), max_tokens))


def test_greedy_64_tokens_equal_llama_cpp(engine, prompts, llama_cpp_model):
    batch = prompts([1, 6, 29, 77], seed=10)
    ours = token_ids(engine.generate(batch, greedy(64)))
    for prompt, tokens in zip(batch, ours, strict=True):
        assert len(tokens) == 64
        assert tokens == _llama_cpp_greedy(llama_cpp_model, prompt, 64)
    assert_all_blocks_free(engine)


def test_batched_equals_one_at_a_time(engine, mixed_prompts, greedy_single):
    outputs = engine.generate(mixed_prompts, greedy(16))
    assert [out.prompt_token_ids for out in outputs] == mixed_prompts
    assert token_ids(outputs) == greedy_single
    assert_all_blocks_free(engine)


def test_batched_with_staggered_arrivals_equals_one_at_a_time(engine, mixed_prompts, greedy_single):
    """Requests joining while others decode (continuous batching) change nothing."""
    params = greedy(16)
    results: dict[str, list[int]] = {}
    pending = list(enumerate(mixed_prompts))
    while pending or engine.has_unfinished_requests():
        if pending:
            i, prompt = pending.pop(0)
            engine.add_request(f"r{i}", prompt, params)
        for out in engine.step():
            results.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
    assert [results[f"r{i}"] for i in range(len(mixed_prompts))] == greedy_single
    assert_all_blocks_free(engine)


@pytest.mark.parametrize("budget", [16, 7])
def test_chunked_prefill_equals_unchunked(make_engine, mixed_prompts, greedy_single, budget):
    engine = make_engine(max_num_batched_tokens=budget)
    steps = []
    schedule = engine.scheduler.schedule

    def spy():
        out = schedule()
        steps.append(out.num_batched_tokens)
        return out

    engine.scheduler.schedule = spy
    assert token_ids(engine.generate(mixed_prompts, greedy(16))) == greedy_single
    assert max(steps) <= budget and sum(steps) >= sum(map(len, mixed_prompts))
    assert_all_blocks_free(engine)


def test_max_num_seqs_limits_the_batch_but_not_the_outputs(make_engine, mixed_prompts, greedy_single):
    engine = make_engine(max_num_seqs=3)
    seen = []
    schedule = engine.scheduler.schedule
    engine.scheduler.schedule = lambda: seen.append(schedule()) or seen[-1]
    assert token_ids(engine.generate(mixed_prompts, greedy(16))) == greedy_single
    assert max(len(out.scheduled) for out in seen) == 3


def test_bf16_batched_equals_one_at_a_time_without_the_fp16_decode_weights(f16_gguf, mixed_prompts):
    """bf16 on CPU is batch-invariant on its own. The default cpu_fp16_small_batch trades that away for
    speed: batches of <= 2 rows use fp16 weight copies (oneDNN's fp16 GEMV is ~1.6x its bf16 one), so a
    bf16 request's tokens may then depend on what else is in flight, as in vLLM without batch invariance."""
    engine = LLMEngine.from_model(
        f16_gguf, kv_cache_memory_bytes=1 << 22, dtype="auto", device="cpu", cpu_fp16_small_batch=False
    )
    assert engine.dtype == torch.bfloat16
    batched = token_ids(engine.generate(mixed_prompts, greedy(16)))
    single = [token_ids(engine.generate([p], greedy(16)))[0] for p in mixed_prompts]
    assert batched == single
