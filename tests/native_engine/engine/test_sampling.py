"""Seeded sampling, n > 1, stop strings and token ids, max_tokens, streaming and abort, end to end."""

from __future__ import annotations

import torch

from native_engine import SamplingParams

from .helpers import assert_all_blocks_free, greedy, seeded, stream, token_ids


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(engine, prompts):
    target, *others = prompts([21, 5, 40, 17], seed=40)
    params = seeded(24, seed=1234)
    alone = token_ids(engine.generate([target], params))[0]
    assert token_ids(engine.generate([target], params))[0] == alone  # same engine, second run
    mixed = [seeded(24, seed=9), params, greedy(24), SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)]
    batched = token_ids(engine.generate([others[0], target, others[1], others[2]], mixed))
    assert batched[1] == alone
    assert token_ids(engine.generate([target], seeded(24, seed=4321)))[0] != alone  # the seed matters
    assert alone != token_ids(engine.generate([target], greedy(24)))[0]  # and it really samples


def test_seeded_sampling_is_reproducible_across_engines(make_engine, prompts):
    batch = prompts([21, 8], seed=41)
    params = seeded(16, seed=5, top_k=50, min_p=0.01)
    assert token_ids(make_engine().generate(batch, params)) == token_ids(
        make_engine(block_size=8).generate(batch, params)
    )


def test_n_completions_differ_when_sampling(engine, prompts):
    prompt = prompts([19], seed=42)[0]  # 19 tokens: the forks share a partly filled block -> copy-on-write
    params = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=12, ignore_eos=True)
    out = engine.generate([prompt], params)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 12 and c.finish_reason == "length" for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) == 4
    again = engine.generate([prompt], params)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]
    assert_all_blocks_free(engine)


def test_n_greedy_completions_all_equal_the_greedy_output(engine, mixed_prompts, greedy_single):
    outputs = engine.generate(mixed_prompts[:5], greedy(16, n=3))
    for out, expected in zip(outputs, greedy_single[:5], strict=True):
        assert [c.index for c in out.outputs] == [0, 1, 2]
        assert [c.token_ids for c in out.outputs] == [expected] * 3
        assert len({c.text for c in out.outputs}) == 1
    assert_all_blocks_free(engine)


def _stop_candidate(text: str) -> tuple[str, int]:
    """A printable ASCII 2-character string that first occurs a few characters into text."""
    for i in range(4, len(text) - 2):
        candidate = text[i : i + 2]
        if candidate.isascii() and candidate.isprintable() and text.find(candidate) == i:
            return candidate, i
    raise AssertionError(f"no stop-string candidate in {text!r}")


def test_stop_string_cuts_the_text_before_it(engine, prompts):
    prompt = prompts([12], seed=43)[0]
    full = engine.generate([prompt], greedy(48))[0].outputs[0]
    stop, index = _stop_candidate(full.text)
    out = engine.generate([prompt], greedy(48, stop=["\x00never", stop]))[0].outputs[0]
    assert out.text == full.text[:index]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    # the tokens end with the one that completed the stop string
    n = len(out.token_ids)
    assert out.token_ids == full.token_ids[:n]
    assert stop in engine.tokenizer.decode(out.token_ids) and stop not in engine.tokenizer.decode(out.token_ids[:-1])
    assert_all_blocks_free(engine)


def test_stop_token_id_ends_the_output(engine, prompts):
    prompt = prompts([12], seed=43)[0]
    full = engine.generate([prompt], greedy(32))[0].outputs[0].token_ids
    k = next(i for i in range(3, 32) if full[i] not in full[:i])
    out = engine.generate([prompt], greedy(32, stop_token_ids=[full[k]]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == full[k]
    assert out.token_ids == full[:k]  # the stop token itself is not part of the output
    assert out.text == engine.tokenizer.decode(full[:k])


def test_max_tokens_gives_length_and_exactly_that_many_tokens(engine, prompts):
    batch = prompts([7, 7, 30, 1], seed=44)
    params = [greedy(1), seeded(5, seed=1), greedy(13), greedy(40)]
    outputs = engine.generate(batch, params)
    for out, p in zip(outputs, params, strict=True):
        completion = out.outputs[0]
        assert out.finished and completion.finish_reason == "length" and completion.stop_reason is None
        assert len(completion.token_ids) == p.max_tokens
        assert completion.text == engine.tokenizer.decode(completion.token_ids)
    assert_all_blocks_free(engine)


def test_streaming_deltas_concatenate_to_the_generate_output(engine, prompts):
    batch = prompts([12, 33, 4], seed=45)
    full = engine.generate([batch[0]], greedy(40))[0].outputs[0]
    stop, _ = _stop_candidate(full.text)
    params = [greedy(40, stop=[stop]), seeded(20, seed=8, n=2), greedy(25, logprobs=2)]
    expected = engine.generate(batch, params)
    deltas = stream(engine, {f"s{i}": (p, q) for i, (p, q) in enumerate(zip(batch, params, strict=True))})
    for i, want in enumerate(expected):
        steps = deltas[f"s{i}"]
        assert [d.finished for d in steps] == [False] * (len(steps) - 1) + [True]
        for c in want.outputs:
            parts = [d for step in steps for d in step.outputs if d.index == c.index]
            assert "".join(d.text for d in parts) == c.text
            assert [t for d in parts for t in d.token_ids] == c.token_ids
            assert [lp for d in parts for lp in d.logprobs] == c.logprobs
            assert [d.finish_reason for d in parts if d.finish_reason] == [c.finish_reason]
    assert expected[0].outputs[0].finish_reason == "stop"
    assert_all_blocks_free(engine)


def test_abort_frees_every_block(make_engine, prompts):
    engine = make_engine(block_size=8, max_num_batched_tokens=32)
    batch = prompts([60, 15, 9, 100], seed=46)
    params = [greedy(50), seeded(50, seed=2, n=3), greedy(50), greedy(50)]
    for i, (p, q) in enumerate(zip(batch, params, strict=True)):
        engine.add_request(f"a{i}", p, q)
    for _ in range(5):  # a0/a1/a2 decoding (a1 forked), a3 still waiting or mid-prefill
        engine.step()
    assert engine.stats()["num_free_blocks"] < engine.stats()["num_kvcache_blocks"]
    for i in range(4):
        engine.abort(f"a{i}")
    assert_all_blocks_free(engine)
    assert engine.model_runner.sampling.slots == {} and engine.model_runner.sampling.generators == {}
    assert engine.step() == []
    # the engine is still usable and gives the same answers as a fresh one
    assert token_ids(engine.generate(batch[:2], greedy(8))) == token_ids(make_engine().generate(batch[:2], greedy(8)))
    assert_all_blocks_free(engine)


def test_top_k_1_sampling_equals_greedy(engine, mixed_prompts, greedy_single):
    params = SamplingParams(temperature=0.7, top_k=1, seed=11, max_tokens=16, ignore_eos=True)
    assert token_ids(engine.generate(mixed_prompts[:4], params)) == greedy_single[:4]


def test_engine_seed_makes_unseeded_sampling_reproducible(make_engine, prompts):
    """vLLM semantics: EngineConfig.seed seeds the randomness of requests without their own seed, so two
    engines built with the same seed give the same samples whatever the process did before."""
    batch = prompts([10, 20], seed=47)
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    runs = []
    for global_seed in (1, 2):
        with torch.random.fork_rng():
            torch.manual_seed(global_seed)  # unrelated use of the global RNG by the host program
            runs.append(token_ids(make_engine(seed=0).generate(batch, params)))
    # BUG: EngineConfig.seed is validated but never used; unseeded requests draw their seed from torch's
    # global RNG (ModelRunner._generator), so the runs differ.
    assert runs[0] == runs[1]
