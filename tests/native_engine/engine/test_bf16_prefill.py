"""The float32 engine's bf16 prefill (`EngineConfig.cpu_bf16_prefill`, layers/bf16_prefill.py): on a CPU that
proves it, prefill rows multiply bf16 weights and attend on bf16 q/k/v, and what a user sees keeps the f32
engine's promises: the prefix cache, chunking and batching do not change a token, the logits stay close to
the f32 path's, and a CPU that cannot prove it keeps f32 (the same tokens as without the setting)."""

from __future__ import annotations

import logging

import pytest
import torch

from native_engine.kernels import cpu_kernels
from native_engine.layers import bf16_prefill

from .helpers import assert_all_blocks_free, greedy, kl_per_position, token_ids
from .test_prefix_cache import _run, _workload


@pytest.fixture
def bf16_engine(make_engine):
    return lambda **kwargs: make_engine(cpu_bf16_prefill=True, **kwargs)


def proven(engine) -> bool:
    return engine.model_runner.extra_weight_bytes > 0


def test_the_path_is_on_only_where_the_cpu_has_bf16_matrix_units_and_a_warning_says_why_not(bf16_engine, caplog):
    """Under ATEN_CPU_CAPABILITY=avx2 or default the CPU has AMX but PyTorch's bf16 flash attention raises:
    the load-time check turns the path off and says so."""
    for check in (bf16_prefill.usable, bf16_prefill.attention_usable):
        check.cache_clear()
    with caplog.at_level(logging.WARNING, logger=bf16_prefill.__name__):
        engine = bf16_engine()
    linears = [m for m in engine.model_runner.model.modules() if getattr(m, "prefill_weight", None) is not None]
    has_units = bool(cpu_kernels.cpu_flags() & set(bf16_prefill.CPU_FLAGS))
    assert proven(engine) == bool(linears) and (has_units or not proven(engine))
    assert sum(m.prefill_weight.numel() * 2 for m in linears) == engine.model_runner.extra_weight_bytes
    assert ("bf16 prefill check" in caplog.text) == (has_units and not proven(engine))


@pytest.mark.parametrize("rows", [1, 7, 32, 33, 100, 700, 1024, 1500])
def test_a_rows_product_does_not_depend_on_the_rows_beside_it(rows):
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(1536, 576, generator=g), torch.randn(960, 576, generator=g).bfloat16()
    whole = bf16_prefill.bf16_linear(x, w)
    assert torch.equal(bf16_prefill.bf16_linear(x[3 : 3 + rows], w), whole[3 : 3 + rows])


@pytest.mark.parametrize("mode", ["prefix cache", "chunked", "batched"])
def test_bf16_prefill_outputs_do_not_depend_on_the_cache_chunking_or_batching(bf16_engine, prompts, mode):
    first, others = _workload(prompts)
    if mode == "prefix cache":
        cached = _run(bf16_engine(enable_prefix_caching=True), first, others, greedy(16))
        plain = _run(bf16_engine(enable_prefix_caching=False), first, others, greedy(16))
        assert [out.num_cached_tokens for out in cached] == [0, 64, 64, 64, 48, 80]
    else:
        engine = bf16_engine(max_num_batched_tokens=16 if mode == "chunked" else 512)
        cached = engine.generate([first, *others], greedy(16))
        alone = bf16_engine(enable_prefix_caching=False)
        plain = [alone.generate([p], greedy(16))[0] for p in (first, *others)]
        assert_all_blocks_free(engine)
    assert token_ids(cached) == token_ids(plain)


def test_bf16_prefill_logits_stay_close_to_the_f32_path(make_engine, bf16_engine, prompts):
    ids = prompts([200], seed=5)[0]
    f32, bf16 = make_engine(), bf16_engine()
    kl = kl_per_position(f32.model_runner.score(ids), bf16.model_runner.score(ids))
    assert kl.mean() < 1e-3 and kl.max() < 2e-2, (float(kl.mean()), float(kl.max()))
    if proven(bf16):
        assert kl.max() > 0  # the bf16 path computed them


def test_a_cpu_that_cannot_prove_it_keeps_f32(make_engine, bf16_engine, prompts, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: {"avx2"})
    bf16_prefill.usable.cache_clear()
    try:
        engine = bf16_engine()
        assert not proven(engine)
        mixed = prompts([9, 40, 130], seed=3)
        assert token_ids(engine.generate(mixed, greedy(8))) == token_ids(make_engine().generate(mixed, greedy(8)))
    finally:
        bf16_prefill.usable.cache_clear()
