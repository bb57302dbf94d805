"""Adapters are kept in float16 on the CPU (lora/punica.py): a float16 adapter file loses nothing (the merged-model
tests of test_lora.py hold at KL 1e-9), and a float32 one is rounded once. Bound for the rounding, measured on
both presets' random rank-8 adapters (rounding to the nearest float16 is a relative error of at most 2^-11 per
value): the adapter's delta x · Aᵀ · Bᵀ · alpha / r has an NMSE of 7.5e-8 .. 1.1e-7 against the float32 file's
(every linear of both presets), asserted < 1e-6; through the whole model, the same greedy tokens as the float32
merged model and a KL per step of at most 1.1e-6 (these random adapters move the logits as much as the weights
do), asserted < 1e-5."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from native_engine import LoRARequest
from native_engine.lora.models import load_lora
from native_engine.lora.punica import LoRAMapping, _stack
from registry.modelbuilder import LoraSpec, build_lora
from registry.modelbuilder.lora_out import build_merged_gguf

from .conftest import _CACHE, BuiltModel, new_engine
from .helpers import greedy
from .test_lora import _merged, assert_llama_cpp_tokens, assert_matches_merged

F32_ADAPTER = LoraSpec(rank=8, alpha=16.0, seed=5, dtype="f32")
DELTA_NMSE_LIMIT = 1e-6
KL_LIMIT = 1e-5


@pytest.fixture
def f32_adapter(model: BuiltModel, models_root: Path) -> tuple[Path, Path]:
    """(a float32 GGUF adapter, the model with it merged in float32)."""
    key = ("lora-f32", model.name)
    if key not in _CACHE:
        _CACHE[key] = (build_lora(models_root / f"{model.name}-f32.gguf", model.spec, F32_ADAPTER),
                       build_merged_gguf(models_root / f"{model.name}-f32-merged.gguf", model.spec, F32_ADAPTER))
    return _CACHE[key]


def _deltas(engine, name: str, num_rows: int = 7) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per adapted linear, (the resident adapter's delta, the float32 file's) on the same random rows."""
    manager = engine.model_runner.lora
    slot, (scale, by_module) = manager.slots[name], manager.host[name]
    out = []
    generator = torch.Generator().manual_seed(0)
    for module, linear in manager.linears.items():
        pairs = {shard: by_module[module][shard] for shard in linear.lora.shards if shard in by_module[module]}
        if not pairs:
            continue
        a, b = _stack(pairs, linear.lora.shards, scale, manager._out_features(linear, pairs))
        x = torch.randn(num_rows, a.shape[1], generator=generator)
        with manager.step(LoRAMapping.build([(num_rows, slot)])):
            ours = linear.lora.apply(x, torch.zeros(num_rows, b.shape[0]))
        out.append((ours, (x.double() @ a.double().T @ b.double().T).float()))
    return out


def test_a_float32_adapter_is_rounded_within_the_bound(model, f32_adapter, prompts):
    gguf_path, merged_path = f32_adapter
    engine = new_engine(model, max_loras=1)
    lora = LoRARequest("f32", str(gguf_path))
    assert_matches_merged(engine, lora, _merged(model, merged_path), prompts([5, 40], seed=9), KL_LIMIT)

    deltas = _deltas(engine, "f32")
    assert len(deltas) == 4 * model.spec.num_layers  # qkv, o, gate_up, down of every layer
    for ours, exact in deltas:
        nmse = ((ours - exact).double().pow(2).sum() / exact.double().pow(2).sum()).item()
        assert 0 < nmse < DELTA_NMSE_LIMIT, nmse  # rounded (not zero), and within the bound


def test_a_float32_adapter_gives_llama_cpp_tokens(model, f32_adapter, prompts):
    """llama.cpp applies the float32 file as it is; the rounded copy gives the same greedy tokens."""
    assert_llama_cpp_tokens(model, f32_adapter[0], prompts)


def test_a_float16_adapter_is_kept_exactly(model, models_root, prompts):
    """The resident stacks hold the file's float16 values (alpha / r a power of two), bit for bit."""
    spec = LoraSpec(rank=4, alpha=8.0, seed=6)
    path = build_lora(models_root / f"{model.name}-f16-exact.gguf", model.spec, spec)
    engine = new_engine(model, max_loras=1)
    engine.generate(prompts([4]), greedy(1), lora_request=LoRARequest("f16", str(path)))
    manager = engine.model_runner.lora
    slot = manager.slots["f16"]
    stored = load_lora("f16", path, manager.model_config).weights
    linear = manager.linears["model.layers.0.mlp.down_proj"]
    a, b = stored["model.layers.0.mlp.down_proj.weight"]
    assert torch.equal(linear.lora.a[slot, :4].float(), a)
    assert torch.equal(linear.lora.bt[slot, :4].float(), b.T * spec.scale)
