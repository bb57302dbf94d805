"""Tensor parallelism on the CPU (gloo): a group's engine answers as the one-rank engine does.

Each test runs the same requests on a one-rank engine and on an N-rank one (ranks 1..N-1 are worker
processes of a group the session shares, `tp_group`), both with the same number of KV blocks (the
per-rank budget is sized for the rank with the most KV heads), so batching, prefix caching and
preemption play out step for step alike. Float32 logits agree to KL < 1e-9 (the row-parallel sums only
reorder float additions) and greedy tokens are identical.

Sizes: 2 on both presets (even splits); 3 on tiny-llama (4 KV heads: 2 + 1 + 1, uneven); 4 on tiny-qwen2
(2 KV heads, each replicated on two ranks).
"""

from __future__ import annotations

import os
import signal

import pytest
from native_engine import EngineConfig, LLMEngine
from native_engine.distributed.partition import max_kv_heads

from .conftest import BuiltModel, new_engine
from .helpers import PreemptionCounter, assert_all_blocks_free, greedy, kl_per_position, token_ids
from .test_prefix_cache import _run as run_prefix_workload
from .test_prefix_cache import _workload as prefix_workload

EXTRA_SIZES = {"tiny-llama": 3, "tiny-qwen2": 4}


def tp_kv_bytes(model: BuiltModel, num_blocks: int, block_size: int, world_size: int) -> int:
    """The per-rank KV budget that gives every rank exactly num_blocks blocks (float32)."""
    s = model.spec
    heads = max_kv_heads(s.num_heads, s.num_kv_heads, world_size)
    return num_blocks * block_size * 2 * s.num_layers * heads * s.head_dim * 4


@pytest.fixture
def tp_engine(model: BuiltModel, tp_group):
    """tp_engine(world_size, num_blocks=256, block_size=16, source="gguf", ...) -> an engine on the shared
    group of that size; closed (its model unloaded from the ranks) after the test."""
    made: list[LLMEngine] = []

    def make(world_size: int, *, num_blocks: int = 256, block_size: int = 16, source: str = "gguf",
             enable_prefix_caching: bool = True, speculative: str | None = None) -> LLMEngine:
        config = EngineConfig(
            str(model.gguf if source == "gguf" else model.hf), tensor_parallel_size=world_size,
            kv_cache_memory_bytes=tp_kv_bytes(model, num_blocks, block_size, world_size), block_size=block_size,
            max_num_batched_tokens=512, max_num_seqs=16, enable_prefix_caching=enable_prefix_caching,
            dtype="float32", num_threads=1, speculative=speculative)
        made.append(LLMEngine(config, group=tp_group(world_size)))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


def sizes(model: BuiltModel) -> list[int]:
    return [2, EXTRA_SIZES[model.name]]


@pytest.mark.parametrize("source", ["gguf", pytest.param("hf", marks=pytest.mark.slow)])
def test_logits_match_one_rank(model, tp_engine, mixed_prompts, source):
    reference = new_engine(model, source=source)
    for world_size in sizes(model) if source == "gguf" else [2]:
        engine = tp_engine(world_size, source=source)
        assert engine.stats()["num_kvcache_blocks"] == reference.stats()["num_kvcache_blocks"] == 256
        for prompt in mixed_prompts:
            kl = kl_per_position(reference.score(prompt), engine.score(prompt))
            assert kl.max() < 1e-9, f"TP={world_size}: max KL {kl.max():.3g} at position {int(kl.argmax())}"
        engine.close()


def test_ngram_speculation_in_a_group_gives_the_one_rank_tokens(model, tp_engine, mixed_prompts):
    """Verify rows travel in the step plan (their drafts, one block table per query token): rank 1 builds
    the same verify inputs, and the greedy tokens are the one-rank engine's without speculation."""
    prompts = [p + p[: len(p) // 2] + p for p in mixed_prompts]  # repeats: n-gram lookup has matches
    expected = token_ids(new_engine(model).generate(prompts, greedy(32)))
    engine = tp_engine(2, speculative="ngram:k=3,adaptive=off")
    assert token_ids(engine.generate(prompts, greedy(32))) == expected
    assert engine.spec_decode_stats()["num_accepted_tokens"] > 0
    assert_all_blocks_free(engine)
    engine.close()


def test_a_draft_model_in_a_group_is_refused_with_what_to_use():
    with pytest.raises(ValueError, match="use speculative 'ngram'"):
        EngineConfig("m.gguf", tensor_parallel_size=2, speculative="draft:small.gguf:k=3")


def test_batched_greedy_outputs_are_identical_over_64_tokens(model, tp_engine, mixed_prompts):
    expected = token_ids(new_engine(model).generate(mixed_prompts, greedy(64)))
    for world_size in sizes(model):
        engine = tp_engine(world_size)
        assert token_ids(engine.generate(mixed_prompts, greedy(64))) == expected, f"TP={world_size}"
        assert_all_blocks_free(engine)
        engine.close()


def test_prefix_cache_hits_are_the_same(model, tp_engine, prompts):
    first, others = prefix_workload(prompts)
    one = run_prefix_workload(new_engine(model), first, others, greedy(16))
    two = run_prefix_workload(tp_engine(2), first, others, greedy(16))
    assert token_ids(two) == token_ids(one)
    assert [o.num_cached_tokens for o in two] == [o.num_cached_tokens for o in one] == [0, 64, 64, 64, 48, 80]


def test_preemption_is_the_same(model, tp_engine, prompts):
    batch = prompts((12, 20, 27, 33, 9), seed=30)
    runs = []
    for engine in (new_engine(model, num_blocks=10, block_size=8), tp_engine(2, num_blocks=10, block_size=8)):
        counter = PreemptionCounter(engine)
        runs.append((token_ids(engine.generate(batch, greedy(24))), counter.count))
        assert_all_blocks_free(engine)
    assert runs[0][1] > 0
    assert runs[1] == runs[0]


def test_a_rank_that_dies_fails_the_next_step(model, mixed_prompts):
    """An engine with its own group (ranks started by it): a dead rank makes the step raise (gloo sees the
    closed connection at once), and every later request is refused with the same cause."""
    engine = LLMEngine.from_model(model.gguf, tensor_parallel_size=2, dtype="float32", num_threads=1,
                                  kv_cache_memory_bytes=tp_kv_bytes(model, 64, 16, 2))
    try:
        assert len(engine.generate(mixed_prompts[:2], greedy(4))) == 2
        [worker] = engine.tp.workers
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        engine.add_request("after", mixed_prompts[0], greedy(4))
        with pytest.raises(RuntimeError, match="tensor-parallel rank"):
            engine.step()
        with pytest.raises(RuntimeError, match="tensor-parallel rank"):
            engine.add_request("later", mixed_prompts[1], greedy(4))
    finally:
        engine.close()
    assert engine.tp is None


@pytest.fixture
def illegal_size(model: BuiltModel) -> tuple[int, str]:
    return {"tiny-qwen2": (3, "4 query heads over 2 KV heads.*legal sizes: 1, 2, 4"),
            "tiny-llama": (8, "4 query heads over 4 KV heads.*legal sizes: 1, 2, 3, 4")}[model.name]


def test_a_size_that_cannot_split_the_heads_is_refused_before_any_rank_starts(model, illegal_size):
    size, message = illegal_size
    with pytest.raises(ValueError, match=f"tensor_parallel_size {size} cannot split {message}"):
        LLMEngine.from_model(model.gguf, tensor_parallel_size=size, dtype="float32")


def test_rank_0_holds_its_shard_only(model, tp_engine):
    """Rank 0's parameters are half the split ones plus the replicated norms, never a full copy."""
    full = sum(p.numel() for p in new_engine(model).model_runner.model.parameters())
    mine = sum(p.numel() for p in tp_engine(2).model_runner.model.parameters())
    s = model.spec
    norms = s.num_layers * 2 * s.hidden_size + s.hidden_size
    assert mine == (full - norms) // 2 + norms
