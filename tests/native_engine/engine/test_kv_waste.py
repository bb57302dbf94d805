"""Paged KV: a sequence never holds more than its last, partly filled block beyond what it uses, so
allocated-but-unused KV slots stay a few percent of the pool on a mixed-length workload."""

from __future__ import annotations

import random
import statistics

from .helpers import assert_all_blocks_free, greedy

NUM_SEQS = 16
BLOCK_SIZE = 16
WASTE_LIMIT = 0.04


def test_kv_waste_mid_run_is_below_4_percent(model, make_engine, prompts):
    engine = make_engine(num_blocks=512, block_size=BLOCK_SIZE, max_num_seqs=NUM_SEQS)
    lengths = random.Random(50).choices(range(50, 301), k=NUM_SEQS)
    for i, prompt in enumerate(prompts(lengths, seed=51)):
        engine.add_request(f"w{i}", prompt, greedy(64))
    scheduler, blocks = engine.scheduler, engine.scheduler.block_manager
    waste: list[float] = []
    while len(waste) < 40:
        engine.step()
        running = scheduler.running
        for seq in running:  # at most one partly used block per sequence
            assert (
                len(seq.block_table) * BLOCK_SIZE - min(seq.num_tokens, len(seq.block_table) * BLOCK_SIZE) < BLOCK_SIZE
            )
        if len(running) == NUM_SEQS and not any(s.num_uncomputed_tokens > 1 for s in running):
            waste.append(blocks.kv_waste(running))
    mean, worst = statistics.fmean(waste), max(waste)
    print(
        f"\n{model.name}: KV waste over 40 decode steps with {NUM_SEQS} seqs of {min(lengths)}..{max(lengths)} "
        f"prompt tokens: mean {mean:.2%}, max {worst:.2%}, min {min(waste):.2%}"
    )
    assert mean < WASTE_LIMIT
    for i in range(NUM_SEQS):
        engine.abort(f"w{i}")
    assert_all_blocks_free(engine)
