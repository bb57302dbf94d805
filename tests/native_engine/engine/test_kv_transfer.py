"""Prefill on one engine, decode on another (kv_transfer.py): the greedy tokens equal the co-located
ones in f32, for prompts of several blocks, a prompt shorter than one block, and a decode engine that
already holds part of the prompt; the decode engine computes only what it did not receive; blocks
that are gone or for another prompt are recomputed; a lease nobody took is reaped."""

from __future__ import annotations

import os

from native_engine import SamplingParams

from .helpers import assert_all_blocks_free, greedy, token_ids

PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
           "remote_block_ids": None, "remote_host": None, "remote_port": None}


def prefill_leg(engine, prompt: list[int]) -> dict:
    out = engine.generate([prompt], greedy(1, kv_transfer_params=dict(PREFILL)))[0]
    assert out.kv_transfer_params is not None
    return out.kv_transfer_params


def decode_leg(engine, prompt: list[int], params: dict, max_tokens: int = 16):
    return engine.generate([prompt], greedy(max_tokens, kv_transfer_params=params))[0]


def test_disaggregated_greedy_tokens_equal_colocated(make_engine, prompts):
    prefill, decode, colocated = make_engine(), make_engine(), make_engine(enable_prefix_caching=False)
    for prompt in prompts([70, 9, 48, 130], seed=3):  # blocks + a tail, shorter than a block, aligned, long
        params = prefill_leg(prefill, prompt)
        assert params["do_remote_prefill"] is True and params["tp_size"] == 1
        usable = (len(prompt) - 1) // 16  # never the last token: it must run for the logits
        assert len(params["remote_block_ids"]) == usable
        out = decode_leg(decode, prompt, params)
        expected = colocated.generate([prompt], greedy(16))[0]
        assert token_ids([out]) == token_ids([expected])
        assert out.num_cached_tokens == usable * 16  # what it received; it computed only the rest
        assert "remote_kv_path" not in params or not os.path.exists(params["remote_kv_path"])  # taken
    assert decode.kv_transfer.num_loaded_blocks == sum((n - 1) // 16 for n in (70, 9, 48, 130))
    assert_all_blocks_free(decode)


def test_a_decode_engine_holding_part_of_the_prompt_takes_only_the_rest(make_engine, prompts):
    prefill, decode, colocated = make_engine(), make_engine(), make_engine(enable_prefix_caching=False)
    system, question = prompts([40, 30], seed=5)
    decode.generate([system + [question[0]]], greedy(2))  # decode caches the system prompt's 2 full blocks
    prompt = system + question
    params = prefill_leg(prefill, prompt)
    out = decode_leg(decode, prompt, params)
    assert token_ids([out]) == token_ids(colocated.generate([prompt], greedy(16)))
    assert decode.kv_transfer.num_loaded_blocks == (len(prompt) - 1) // 16 - 2
    assert out.num_cached_tokens == ((len(prompt) - 1) // 16) * 16


def test_blocks_for_another_prompt_or_gone_are_recomputed(make_engine, prompts):
    prefill, decode, colocated = make_engine(), make_engine(), make_engine(enable_prefix_caching=False)
    first, second, third = prompts([50, 50, 50], seed=7)
    wrong = prefill_leg(prefill, first)
    out = decode_leg(decode, second, wrong)  # another prompt's blocks: not used
    assert token_ids([out]) == token_ids(colocated.generate([second], greedy(16))) and out.num_cached_tokens == 0
    gone = prefill_leg(prefill, third)
    os.unlink(gone["remote_kv_path"])  # the lease ran out and the prefill engine removed them
    out = decode_leg(decode, third, gone)
    assert token_ids([out]) == token_ids(colocated.generate([third], greedy(16))) and out.num_cached_tokens == 0
    assert decode.kv_transfer.num_load_failures == 2


def test_a_lease_nobody_took_is_reaped(make_engine, prompts):
    prefill = make_engine()
    prefill.kv_transfer.lease_s = 0.0
    params = prefill_leg(prefill, prompts([40], seed=9)[0])
    assert os.path.exists(params["remote_kv_path"])
    prefill.kv_transfer.reap()
    assert not os.path.exists(params["remote_kv_path"]) and prefill.kv_transfer.leased == {}


def test_a_plain_request_neither_saves_nor_loads(engine, prompts):
    out = engine.generate(prompts([40], seed=11), SamplingParams(temperature=0.0, max_tokens=1))[0]
    assert out.kv_transfer_params is None and engine.kv_transfer.leased == {}
