"""Boundaries of the paged path: odd block sizes, one-token steps, forks beyond max_num_seqs, prefix
blocks shared with running sequences, the end of the context window."""

from __future__ import annotations

import itertools

import pytest

from .helpers import assert_all_blocks_free, greedy, token_ids


@pytest.mark.parametrize("block_size", [1, 5, 32])
def test_block_sizes(make_engine, mixed_prompts, greedy_single, block_size):
    engine = make_engine(block_size=block_size, num_blocks=4096 // block_size)
    assert token_ids(engine.generate(mixed_prompts, greedy(16))) == greedy_single
    assert_all_blocks_free(engine)


def test_one_token_per_step(make_engine, mixed_prompts, greedy_single):
    """max_num_batched_tokens=1: every prefill chunk is a single token (through the decode path)."""
    engine = make_engine(max_num_batched_tokens=1, block_size=4, num_blocks=256)
    chosen = [0, 2, 3]  # 3, 17 and 30 prompt tokens
    outputs = engine.generate([mixed_prompts[i] for i in chosen], greedy(5))
    assert token_ids(outputs) == [greedy_single[i][:5] for i in chosen]
    assert_all_blocks_free(engine)


def test_more_forks_than_max_num_seqs(make_engine, mixed_prompts, greedy_single):
    engine = make_engine(max_num_seqs=2)
    outputs = engine.generate(mixed_prompts[1:3], greedy(16, n=3))
    assert [[c.token_ids for c in out.outputs] for out in outputs] == [[g] * 3 for g in greedy_single[1:3]]
    assert_all_blocks_free(engine)


def test_prefix_hits_on_blocks_of_a_running_sequence(make_engine, prompts):
    """B arrives while A (same 50-token prefix) is still decoding: B shares A's live blocks."""
    shared = prompts([50], seed=60)[0]
    a, b = shared + prompts([3], seed=61)[0], shared + prompts([9], seed=62)[0]
    expected = token_ids(make_engine(enable_prefix_caching=False).generate([a, b], greedy(12)))
    engine = make_engine(block_size=8, max_num_batched_tokens=24)  # A's prefill takes 3 steps
    engine.add_request("a", a, greedy(12))
    results: dict[str, list[int]] = {}
    cached = {}
    for step in itertools.count():
        if step == 4:
            engine.add_request("b", b, greedy(12))
        for out in engine.step():
            results.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
            cached[out.request_id] = out.num_cached_tokens
        if step > 4 and not engine.has_unfinished_requests():
            break
    assert [results["a"], results["b"]] == expected
    assert cached == {"a": 0, "b": 48}  # 6 full blocks of 8 from A's prompt
    assert_all_blocks_free(engine)


def test_generation_stops_at_the_context_window(engine, prompts, llama_cpp_model, model):
    """A 500-token prompt in a 512-token model: 12 tokens, finish_reason "length", same as llama.cpp."""
    prompt = prompts([500], seed=63)[0]
    out = engine.generate([prompt], greedy(30))[0].outputs[0]
    assert model.spec.context_length == 512
    assert out.finish_reason == "length" and len(out.token_ids) == 12
    expected = list(itertools.islice(llama_cpp_model.generate(prompt, top_k=1, temp=0.0, reset=True), 12))
    assert out.token_ids == expected
    assert_all_blocks_free(engine)
