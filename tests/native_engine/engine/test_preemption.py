"""Preemption (recompute) under a tiny KV pool leaves every output unchanged."""

from __future__ import annotations

import pytest

from native_engine import SamplingParams

from .helpers import PreemptionCounter, all_token_ids, assert_all_blocks_free, greedy, seeded

BLOCK_SIZE = 8
LENGTHS = (12, 20, 27, 33, 9)  # + 24 generated: up to 57 tokens = 8 blocks each, ~33 blocks in all


def _params(mode: str) -> list[SamplingParams]:
    if mode == "greedy":
        return [greedy(24)] * len(LENGTHS)
    # seeded: different seeds per request, one request with n=2 (forked children share prompt blocks)
    return [seeded(24, seed=100 + i, n=2 if i == 1 else 1) for i in range(len(LENGTHS))]


def _run(make_engine, batch, params, num_blocks, caching):
    engine = make_engine(num_blocks=num_blocks, block_size=BLOCK_SIZE, enable_prefix_caching=caching)
    counter = PreemptionCounter(engine)
    outputs = engine.generate(batch, params)
    assert_all_blocks_free(engine)
    assert all(c.finish_reason == "length" and len(c.token_ids) == 24 for out in outputs for c in out.outputs)
    return all_token_ids(outputs), counter.count


@pytest.mark.parametrize("caching", [True, False], ids=["prefix-cache", "no-prefix-cache"])
@pytest.mark.parametrize("mode", ["greedy", "seeded"])
def test_preemption_does_not_change_outputs(make_engine, prompts, mode, caching):
    batch = prompts(LENGTHS, seed=30)
    expected, none = _run(make_engine, batch, _params(mode), num_blocks=256, caching=caching)
    assert none == 0
    got, preemptions = _run(make_engine, batch, _params(mode), num_blocks=10, caching=caching)  # 80 token slots
    assert preemptions > 0
    assert got == expected


def test_single_sequence_filling_the_whole_pool(make_engine, prompts):
    """One request whose prompt + output needs every block of the pool still finishes."""
    batch = prompts([40], seed=31)
    expected, _ = _run(make_engine, batch, [greedy(24)], num_blocks=256, caching=False)
    got, preemptions = _run(make_engine, batch, [greedy(24)], num_blocks=8, caching=True)  # 64 slots = 40 + 24
    assert got == expected and preemptions == 0
