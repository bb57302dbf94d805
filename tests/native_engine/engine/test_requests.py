"""Request handling around the loop: bad prompts, text prompts and BOS, EOS, special tokens in the text."""

from __future__ import annotations

import pytest
import torch

from native_engine import SamplingParams

from .conftest import new_engine
from .helpers import assert_all_blocks_free, greedy, token_ids


@pytest.mark.parametrize("bad", [[], [10**6]], ids=["empty", "out-of-vocab"])
def test_bad_prompt_is_rejected_without_running_anything(engine, prompts, bad):
    good = prompts([5], seed=70)[0]
    with pytest.raises(ValueError):
        engine.generate([good, bad], greedy(4))
    # BUG: generate() adds the prompts one by one, so `good` stays queued after the ValueError and is
    # silently run (and its output dropped) by the next generate()/step().
    assert not engine.has_unfinished_requests()
    assert engine.requests == {}


def test_prompt_longer_than_the_kv_pool_is_rejected(make_engine, prompts):
    engine = make_engine(num_blocks=4, block_size=8)  # 32 token slots
    with pytest.raises(ValueError):
        engine.generate(prompts([40], seed=71), greedy(4))
    assert_all_blocks_free(engine)


def _force_token(engine, token_id: int, at_call: int) -> None:
    """Make the sampler's `at_call`-th call return token_id for every row."""
    sampler, calls = engine.model_runner.sampler, []

    def forced(logits, meta):
        out = sampler(logits, meta)
        calls.append(None)
        if len(calls) == at_call:
            out.token_ids.fill_(token_id)
        return out

    engine.model_runner.sampler = forced


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_in_the_text_follow_skip_special_tokens(engine, prompts, skip):
    tokenizer = engine.tokenizer
    special = next(
        i for i in range(engine.model_config.vocab_size) if tokenizer.is_special(i) and i not in tokenizer.eos_token_ids
    )
    _force_token(engine, special, at_call=3)
    out = engine.generate(prompts([6], seed=72), greedy(6, skip_special_tokens=skip))[0].outputs[0]
    assert out.token_ids[2] == special
    # BUG: the engine's detokenizer drops special tokens whatever skip_special_tokens says.
    assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=skip)


def test_eos_finishes_with_stop_unless_ignore_eos(engine, prompts):
    eos = engine.tokenizer.eos_token_ids[0]
    prompt = prompts([6], seed=73)
    _force_token(engine, eos, at_call=4)
    out = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=10))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason is None and len(out.token_ids) == 3
    _force_token(engine, eos, at_call=4)
    out = engine.generate(prompt, greedy(10))[0].outputs[0]  # ignore_eos=True
    assert out.finish_reason == "length" and len(out.token_ids) == 10 and out.token_ids[3] == eos
    assert token_ids(engine.generate(prompt, greedy(3)))[0] == out.token_ids[:3]


TEXT = "Hello world, the quick brown fox jumps over the lazy dog."


def test_text_prompts_are_tokenized_like_llama_cpp(engine, llama_cpp_model):
    expected = llama_cpp_model.tokenize(TEXT.encode())
    out = engine.generate([TEXT], greedy(8))[0]
    assert out.prompt_token_ids == expected
    assert out.outputs[0].token_ids == token_ids(engine.generate([expected], greedy(8)))[0]


def test_text_prompts_get_bos_when_the_model_asks_for_it(bos_model):
    llama_cpp = pytest.importorskip("llama_cpp")
    engine = new_engine(bos_model)
    assert engine.tokenizer.add_bos_token
    llm = llama_cpp.Llama(str(bos_model.gguf), n_ctx=64, verbose=False, n_threads=1)
    try:
        expected = llm.tokenize(TEXT.encode())  # llama.cpp (and HF / vLLM) prepend BOS here
    finally:
        llm.close()
    assert expected[0] == engine.tokenizer.bos_token_id
    # BUG: LLMEngine.add_request/score encode str prompts without add_bos, so BOS is missing.
    assert engine.generate([TEXT], greedy(2))[0].prompt_token_ids == expected
    torch.testing.assert_close(engine.score(TEXT), engine.score(expected))
