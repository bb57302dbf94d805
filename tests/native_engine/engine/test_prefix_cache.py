"""Prefix-cache hits skip work but never change outputs."""

from __future__ import annotations

import pytest

from .helpers import assert_all_blocks_free, greedy, seeded, token_ids


def _workload(prompts):
    system = prompts([70], seed=20)[0]  # 4 full blocks of 16, plus 6 tokens
    first = system + prompts([10], seed=21)[0]  # 80 tokens = 5 full blocks
    others = [
        list(first),  # the same prompt again: all but the last block may hit
        first[:65],  # 4 cached blocks + 1 token: a one-token "prefill" through the decode path
        system + prompts([23], seed=22)[0],  # same system prompt, other question
        system[:64],  # exactly 4 blocks: at most 3 may hit, the last token must be computed
    ]
    return first, others


def _run(engine, first, others, params):
    out_first = engine.generate([first], params)[0]
    continuation = first + out_first.outputs[0].token_ids  # a second turn: prompt + answer + more
    outputs = engine.generate([*others, continuation], params)
    return [out_first, *outputs]


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
def test_prefix_cache_hits_do_not_change_outputs(make_engine, prompts, mode):
    first, others = _workload(prompts)
    params = greedy(16) if mode == "greedy" else seeded(16, seed=7)
    cached = _run(make_engine(enable_prefix_caching=True), first, others, params)
    uncached = _run(make_engine(enable_prefix_caching=False), first, others, params)
    assert token_ids(cached) == token_ids(uncached)
    assert [out.num_cached_tokens for out in uncached] == [0] * 6
    # hits are whole blocks, never the last token; the continuation reuses the first answer's full blocks
    # (80 prompt + 15 computed answer tokens -> 5 full blocks)
    assert [out.num_cached_tokens for out in cached] == [0, 64, 64, 64, 48, 80]


def test_prefix_cache_survives_eviction_pressure(make_engine, prompts):
    """A 14-block pool: the noise requests evict the tail of the first prompt's cached blocks (LRU frees
    the last block first), later requests still hit the surviving head; outputs equal the uncached run."""
    first, others = _workload(prompts)
    noise = prompts([100, 40], seed=23)  # 7 + 3 blocks: the 8 never-used blocks, then 2 cached ones
    results = {}
    for caching, num_blocks in ((True, 14), (False, 256)):
        engine = make_engine(num_blocks=num_blocks, enable_prefix_caching=caching)
        out_first = engine.generate([first], greedy(8))[0]
        engine.generate(noise, greedy(8))
        continuation = first + out_first.outputs[0].token_ids  # 80 + 7 computed: 5 full cached blocks
        results[caching] = engine.generate([continuation, *others], greedy(8))
        assert_all_blocks_free(engine)
    assert token_ids(results[True]) == token_ids(results[False])
    # the 5th block (tokens 64..79) was evicted; blocks 0..3 survived
    assert [out.num_cached_tokens for out in results[True]] == [64, 64, 64, 64, 48]


def test_hit_counters(engine, prompts):
    first, _ = _workload(prompts)
    engine.generate([first], greedy(4))
    engine.generate([first], greedy(4))
    blocks = engine.scheduler.block_manager
    assert blocks.num_prefix_hit_tokens == 64 and blocks.num_prefix_query_tokens == 160
    assert_all_blocks_free(engine)
