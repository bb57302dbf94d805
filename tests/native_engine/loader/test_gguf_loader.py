"""GGUF tensors come back with HF names, HF shapes and HF (un-permuted) values."""

from __future__ import annotations

import types

import gguf
import numpy as np
import pytest
import torch

from native_engine.loader import load_checkpoint, load_gguf, load_hf, load_model
from native_engine.loader.gguf_loader import hf_name
from registry.modelbuilder import PRESETS
from registry.modelbuilder.gguf_out import gguf_name
from registry.modelbuilder.weights import tensor_specs

from .conftest import rewrite_gguf


def _load(path, dtype=torch.float32):
    config, tensors = load_model(path, dtype)
    return config, dict(tensors)


@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-llama"])
def test_f32_gguf_tensors_equal_hf_tensors_exactly(build, preset):
    _, from_gguf = _load(build(preset))
    _, from_hf = _load(build(preset, "hf"))
    assert from_gguf.keys() == from_hf.keys() == {ts.name for ts in tensor_specs(PRESETS[preset])}
    for name, tensor in from_gguf.items():
        assert tensor.dtype == torch.float32 and tensor.is_contiguous()
        assert torch.equal(tensor, from_hf[name]), name


def test_llama_qk_rows_are_permuted_in_the_file_and_restored(build):
    raw = {t.name: np.array(t.data) for t in gguf.GGUFReader(build("tiny-llama")).tensors}
    _, hf = _load(build("tiny-llama", "hf"))
    for proj in ("q_proj", "k_proj"):
        name = f"model.layers.0.self_attn.{proj}.weight"
        assert not np.array_equal(raw[gguf_name(name)], hf[name].numpy())  # really permuted on disk...
    _, loaded = _load(build("tiny-llama"))
    assert torch.equal(loaded["model.layers.0.self_attn.k_proj.weight"], hf["model.layers.0.self_attn.k_proj.weight"])


@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-llama"])
def test_f16_gguf_within_fp16_rounding(build, preset):
    _, from_gguf = _load(build(preset, dtype="f16"))
    _, from_hf = _load(build(preset, "hf"))
    for name, tensor in from_gguf.items():
        expected = from_hf[name]
        # matrices are stored as F16 (exactly the fp16 rounding of the f32 values), 1-D tensors as F32
        assert torch.equal(tensor, expected.half().float() if expected.dim() == 2 else expected), name


def test_requested_dtype_and_lazy_iteration(build):
    config, tensors = load_gguf(build("tiny-qwen2"), torch.bfloat16)
    assert isinstance(tensors, types.GeneratorType)
    name, first = next(tensors)
    assert name == "model.embed_tokens.weight"
    assert first.dtype == torch.bfloat16 and first.shape == (config.vocab_size, config.hidden_size)
    _, hf = _load(build("tiny-qwen2", "hf"), torch.bfloat16)
    assert torch.equal(first, hf[name])


@pytest.mark.parametrize("fmt", ["gguf", "hf"])
def test_load_checkpoint_returns_config_weights_and_tokenizer(build, fmt):
    config, weights, tokenizer = load_checkpoint(build("tiny-llama", fmt))
    assert config == load_model(build("tiny-llama", "hf"))[0]
    assert len(dict(weights)) == len(tensor_specs(PRESETS["tiny-llama"]))
    assert tokenizer.eos_token_ids == config.eos_token_ids and tokenizer.vocab_size == config.vocab_size


def test_load_gguf_accepts_an_open_reader(build):
    config, weights = load_gguf(gguf.GGUFReader(build("tiny-qwen2")))
    assert config.architecture == "qwen2" and next(weights)[0] == "model.embed_tokens.weight"


def test_bf16_tensors_load(build, tmp_path):
    _, hf = _load(build("tiny-llama", "hf"))
    values = hf["model.layers.0.mlp.up_proj.weight"].numpy()
    bf16 = gguf.quants.quantize(values, gguf.GGMLQuantizationType.BF16)
    path = rewrite_gguf(
        build("tiny-llama"), tmp_path / "bf16.gguf",
        extra_tensors={"blk.9.ffn_up.weight": (bf16, gguf.GGMLQuantizationType.BF16)},
    )  # fmt: skip
    _, loaded = _load(path)
    assert torch.equal(
        loaded["model.layers.9.mlp.up_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"].bfloat16().float()
    )


def test_unsupported_tensor_type_fails_before_iterating(build, tmp_path):
    q8_1 = gguf.GGMLQuantizationType.Q8_1
    block, size = gguf.GGML_QUANT_SIZES[q8_1]
    raw = np.zeros((4, 64 // block * size), dtype=np.uint8)
    path = rewrite_gguf(build("tiny-qwen2"), tmp_path / "q81.gguf", extra_tensors={"blk.9.ffn_up.weight": (raw, q8_1)})
    with pytest.raises(ValueError, match=r"'blk.9.ffn_up.weight' has type Q8_1"):
        load_gguf(path)


def test_hf_names_round_trip_and_unknown_names_fail():
    for ts in tensor_specs(PRESETS["tiny-llama"]) + tensor_specs(PRESETS["tiny-qwen2"]):
        assert hf_name(gguf_name(ts.name)) == ts.name
    for bad in ("blk.0.attn_q_norm.weight", "blk.x.attn_q.weight", "tok.weight"):
        with pytest.raises(ValueError, match="no Hugging Face name"):
            hf_name(bad)


def test_hf_loader_requires_safetensors(build, tmp_path):
    (tmp_path / "config.json").write_bytes((build("tiny-qwen2", "hf") / "config.json").read_bytes())
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_hf(tmp_path)
