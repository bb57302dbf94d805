"""Speculative decoding end to end on the tiny presets: the same greedy tokens with and without it (through
continuous batching, chunked prefill and the prefix cache), the same tokens for seeded requests, stops
inside a verify row, per-request on/off, the counters; and verify rows through the C decode kernels
against the module path."""

from __future__ import annotations

import pytest
import torch

from native_engine import SamplingParams
from native_engine.kernels import cpu_kernels
from native_engine.models.cpu_decode import CPUDecodeStack

from .conftest import PRESETS
from .helpers import assert_all_blocks_free, greedy, seeded, token_ids
from .test_cpu_decode import Checked, CheckedBatch, q8_0, requantized_engine

FORCED = "ngram:k=4,adaptive=off"  # verify every n-gram match: the mechanism, not the policy


def repetitive(prompts, lengths, seed=0):
    """Prompts that repeat a span, so n-gram lookup has something to propose from the start."""
    return [p + p[: len(p) // 2] + p for p in prompts(lengths, seed=seed)]


def test_greedy_equal_with_and_without_speculation(make_engine, prompts):
    batch = repetitive(prompts, [3, 9, 17, 30, 48], seed=4)
    plain = token_ids(make_engine().generate(batch, greedy(40)))
    engine = make_engine(speculative=FORCED)
    assert token_ids(engine.generate(batch, greedy(40))) == plain
    stats = engine.spec_decode_stats()
    assert stats["num_drafts"] > 0 and stats["num_accepted_tokens"] > 0, stats
    assert stats["num_accepted_tokens"] <= stats["num_draft_tokens"]
    assert_all_blocks_free(engine)


def test_greedy_equal_with_chunked_prefill_prefix_cache_and_staggered_arrivals(make_engine, prompts):
    batch = repetitive(prompts, [20, 40, 60], seed=5)
    batch += [batch[0] + [7, 8, 9]]  # shares the first prompt's blocks
    plain = token_ids(make_engine(max_num_batched_tokens=32).generate(batch, greedy(30)))
    engine = make_engine(speculative=FORCED, max_num_batched_tokens=32, block_size=4)
    results, pending = {}, list(enumerate(batch))
    while pending or engine.has_unfinished_requests():
        if pending:  # one new request per step, while the others decode and verify
            i, prompt = pending.pop(0)
            engine.add_request(f"r{i}", prompt, greedy(30))
        for out in engine.step():
            results.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
    assert [results[f"r{i}"] for i in range(len(batch))] == plain
    assert engine.scheduler.block_manager.num_prefix_hit_tokens > 0
    assert engine.spec_decode_stats()["num_accepted_tokens"] > 0
    assert_all_blocks_free(engine)


def test_seeded_requests_keep_their_tokens(make_engine, prompts):
    batch = repetitive(prompts, [10, 25], seed=6)
    params = [seeded(24, seed=11), seeded(24, seed=12, top_p=1.0, temperature=1.0)]
    plain = token_ids(make_engine().generate(batch, params))
    assert token_ids(make_engine(speculative=FORCED).generate(batch, params)) == plain


def test_sampled_rows_speculate_and_finish(make_engine, prompts):
    batch = repetitive(prompts, [10, 25, 40], seed=7)
    engine = make_engine(speculative=FORCED)
    outs = engine.generate(batch, SamplingParams(temperature=0.8, top_k=20, max_tokens=30, ignore_eos=True))
    assert [len(t) for t in token_ids(outs)] == [30, 30, 30]
    assert engine.spec_decode_stats()["num_drafts"] > 0
    assert_all_blocks_free(engine)


def test_stops_inside_a_verify_row(make_engine, prompts):
    """A stop token or max_tokens reached by an accepted draft ends the sequence there."""
    batch = repetitive(prompts, [12, 30], seed=8)
    full = token_ids(make_engine().generate(batch, greedy(40)))
    stop_at = [tokens[17] for tokens in full]
    engine = make_engine(speculative=FORCED)
    params = [greedy(40, stop_token_ids=[stop_at[0]]), greedy(40, stop_token_ids=[stop_at[1]])]
    expected = [make_engine().generate([p], q)[0] for p, q in zip(batch, params, strict=True)]
    got = engine.generate(batch, params)
    for e, g in zip(expected, got, strict=True):
        assert g.outputs[0].token_ids == e.outputs[0].token_ids
        assert (g.outputs[0].finish_reason, g.outputs[0].stop_reason) == (e.outputs[0].finish_reason,
                                                                          e.outputs[0].stop_reason)
    for n in (1, 5, 13):
        assert len(token_ids(engine.generate(batch, greedy(n)))[0]) == n
    assert_all_blocks_free(engine)


def test_per_request_switch_and_request_counters(make_engine, prompts):
    batch = repetitive(prompts, [20], seed=9)
    engine = make_engine(speculative=FORCED)
    off = engine.generate(batch, greedy(30, speculative=False))[0]
    assert engine.spec_decode_stats()["num_drafts"] == 0 and off.metrics.num_draft_tokens == 0
    on = engine.generate(batch, greedy(30))[0]
    assert on.outputs[0].token_ids == off.outputs[0].token_ids
    assert on.metrics.num_draft_tokens == engine.spec_decode_stats()["num_draft_tokens"] > 0
    assert on.metrics.num_accepted_tokens == engine.spec_decode_stats()["num_accepted_tokens"]
    plain = make_engine()  # no method configured: a request turns the n-gram default on
    assert plain.generate(batch, greedy(30, speculative=True))[0].outputs[0].token_ids == off.outputs[0].token_ids
    assert plain.spec_decode_stats() is not None


@pytest.mark.skipif(cpu_kernels.library() is None, reason="no C compiler: decode runs through modules")
def test_verify_rows_through_the_c_rows_kernel_match_the_module_path(tmp_path):
    engine, lm = requantized_engine(tmp_path, "tiny-llama", PRESETS["tiny-llama"], num_blocks=64)
    engine.enable_speculation()
    engine.speculator.adaptive.adaptive, engine.speculator.k = False, 2  # 3 query rows: llama_decode_rows
    engine.speculator.adaptive.k = 2
    lm.lm_head.packed = (q8_0(lm.lm_head.weight.data),)
    stack = CPUDecodeStack.build(lm.model, lm.lm_head)
    lm.model.cpu_decode = checked = Checked(lm, stack)
    prompt = [5, 17, 300, 2, 9, 5, 17, 300, 2, 9, 5, 17]
    engine.generate([prompt], greedy(24))
    assert engine.spec_decode_stats()["num_drafts"] > 0 and {2, 3} & set(checked.rows)
    assert max(checked.kl) < 1e-8 and max(checked.diff) < 1e-3, (max(checked.kl), max(checked.diff))


@pytest.mark.skipif(cpu_kernels.library() is None, reason="no C compiler: decode runs through modules")
def test_verify_rows_through_the_c_batch_kernel_match_the_module_path(tmp_path):
    from native_engine.kernels import cpu_batch

    if cpu_batch.library() is None:
        pytest.skip("a plain-C build (no AVX2 or AVX-512 tier): batches use the float32 kernels")
    spec = PRESETS["tiny-llama"].with_(hidden_size=256, num_heads=4, num_kv_heads=2)
    engine, lm = requantized_engine(tmp_path, "tiny-llama-64", spec, num_blocks=96)
    engine.enable_speculation()
    engine.speculator.adaptive.adaptive = False
    stack = CPUDecodeStack.build(lm.model, lm.lm_head)
    lm.model.cpu_decode = checked = CheckedBatch(lm, stack)
    prompt = [5, 17, 300, 2, 9, 5, 17, 300, 2, 9, 5, 17]
    engine.generate([prompt, prompt[::-1] * 2], greedy(30))
    assert engine.spec_decode_stats()["num_drafts"] > 0 and checked.rows
    assert max(checked.diff) < 1e-3, max(checked.diff)


def test_a_model_as_its_own_draft_accepts_everything(make_engine, prompts, model):
    """The draft-model mechanism: the target as its own draft proposes exactly the target's greedy tokens."""
    batch = repetitive(prompts, [5, 30, 70], seed=10) + prompts([12], seed=11)
    plain = token_ids(make_engine().generate(batch, greedy(24)))
    engine = make_engine(speculative=f"draft:{model.gguf}:k=3,adaptive=off", max_num_batched_tokens=64)
    assert token_ids(engine.generate(batch, greedy(24))) == plain
    stats = engine.spec_decode_stats()
    assert stats["num_draft_tokens"] > 0 and stats["acceptance_rate"] == 1.0, stats
    assert_all_blocks_free(engine)


def test_draft_model_sampled_rows(make_engine, prompts, model):
    batch = repetitive(prompts, [10, 40], seed=12)
    engine = make_engine(speculative=f"draft:{model.gguf}:k=3,adaptive=off")
    outs = engine.generate(batch, SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, ignore_eos=True))
    assert [len(t) for t in token_ids(outs)] == [20, 20]
    stats = engine.spec_decode_stats()
    # the same model drafting at the same temperature: q = p, every draft is accepted
    assert stats["num_draft_tokens"] > 0 and stats["acceptance_rate"] == 1.0, stats
    assert_all_blocks_free(engine)


def test_draft_model_with_another_vocabulary_is_refused(make_engine, models_root):
    from registry.modelbuilder import build_gguf

    other = build_gguf(models_root / "tiny-other-vocab.gguf", PRESETS["tiny-llama"].with_(vocab_size=300), dtype="f32")
    with pytest.raises(ValueError, match="vocabulary"):
        make_engine(speculative=f"draft:{other}:k=2")


def test_stop_strings_inside_a_verify_row(make_engine, prompts):
    batch = repetitive(prompts, [12, 30], seed=13)
    texts = [o.outputs[0].text for o in make_engine().generate(batch, greedy(40))]
    stops = [t[len(t) // 2 : len(t) // 2 + 3] for t in texts]
    params = [SamplingParams(temperature=0, max_tokens=40, stop=[s]) for s in stops]
    plain = make_engine().generate(batch, params)
    spec = make_engine(speculative=FORCED).generate(batch, params)
    for p, s in zip(plain, spec, strict=True):
        assert (s.outputs[0].text, s.outputs[0].finish_reason, s.outputs[0].stop_reason) == \
            (p.outputs[0].text, p.outputs[0].finish_reason, p.outputs[0].stop_reason)
        assert s.outputs[0].token_ids == p.outputs[0].token_ids


def test_a_truncated_self_draft_is_lossless(make_engine, prompts, model):
    """layers=1: the model's first layer, its final norm and head as the draft; whatever it proposes, the
    greedy tokens are the target's."""
    batch = repetitive(prompts, [8, 20], seed=14)
    plain = token_ids(make_engine().generate(batch, greedy(20)))
    engine = make_engine(speculative=f"draft:{model.gguf}:k=2,layers=1,adaptive=off")
    assert len(engine.speculator.proposer.runner.model.model.layers) == 1
    assert token_ids(engine.generate(batch, greedy(20))) == plain
    assert engine.spec_decode_stats()["num_draft_tokens"] > 0


def test_scheduling_ahead_stands_aside_while_speculating(make_engine, prompts):
    """An engine that schedules ahead and speculates: verify steps need the previous step's tokens on the host,
    so no step is scheduled ahead once a speculator exists, and the tokens stay the plain ones, also when a
    request turns speculation on in the middle of a run that was scheduling ahead."""
    from .test_async_scheduling import AheadCounter

    batch = repetitive(prompts, [9, 17, 30], seed=8)
    plain = token_ids(make_engine().generate(batch, greedy(40)))
    engine = make_engine(speculative=FORCED, async_scheduling=True)
    counter = AheadCounter(engine)
    assert token_ids(engine.generate(batch, greedy(40))) == plain
    assert counter.count == 0 and engine.spec_decode_stats()["num_accepted_tokens"] > 0
    assert_all_blocks_free(engine)

    engine = make_engine(async_scheduling=True)
    counter = AheadCounter(engine)
    results = {}
    engine.add_request("r0", batch[0], greedy(40))
    engine.add_request("r1", batch[1], greedy(40))
    for _ in range(6):  # r0 and r1 decode with steps scheduled ahead
        for out in engine.step():
            results.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
    assert counter.count > 0
    engine.add_request("r2", batch[2], greedy(40, speculative=True))  # turns the n-gram speculator on
    while engine.has_unfinished_requests():
        for out in engine.step():
            results.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
    assert [results[f"r{i}"] for i in range(3)] == plain
    assert engine.spec_decode_stats()["num_drafts"] > 0
    assert_all_blocks_free(engine)
