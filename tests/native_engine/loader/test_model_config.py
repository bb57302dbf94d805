"""ModelConfig from GGUF metadata and from HF config.json agree; metadata edge cases."""

from __future__ import annotations

import json
from dataclasses import replace

import gguf
import numpy as np
import pytest

from native_engine.loader import ModelConfig
from registry.modelbuilder import CHATML_TEMPLATE, PRESETS

from .conftest import rewrite_gguf

VT = gguf.GGUFValueType


@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-llama"])
def test_gguf_config_equals_hf_config(build, preset):
    from_gguf = ModelConfig.from_gguf(build(preset))
    from_hf = ModelConfig.from_hf(build(preset, "hf"))
    assert from_gguf == from_hf
    spec = PRESETS[preset]
    assert from_gguf.architecture == spec.arch
    assert (from_gguf.num_heads, from_gguf.num_kv_heads, from_gguf.head_dim) == (
        spec.num_heads, spec.num_kv_heads, spec.head_dim,
    )  # fmt: skip
    assert from_gguf.tie_word_embeddings is spec.tie_embeddings
    assert from_gguf.qkv_bias is spec.qkv_bias
    assert from_gguf.rms_norm_eps == spec.rms_eps  # float32 in GGUF, rounded back to the written decimal
    assert from_gguf.rope_theta == spec.rope_theta
    assert from_gguf.chat_template == CHATML_TEMPLATE


def test_eos_ids_primary_first_then_llama_cpp_end_of_generation_tokens(build):
    config = ModelConfig.from_gguf(build("tiny-qwen2"))
    tokens = gguf.GGUFReader(build("tiny-qwen2")).fields["tokenizer.ggml.tokens"].contents()
    assert [tokens[i] for i in config.eos_token_ids] == ["<|im_end|>", "<|endoftext|>"]
    assert tokens[config.bos_token_id] == "<|endoftext|>"


def test_gguf_rope_scaling_eot_and_key_length(build, tmp_path):
    path = rewrite_gguf(
        build("tiny-llama"),
        tmp_path / "scaled.gguf",
        set_fields={
            "llama.rope.scaling.type": ("yarn", VT.STRING),
            "llama.rope.scaling.factor": (4.0, VT.FLOAT32),
            "llama.rope.scaling.original_context_length": (128, VT.UINT32),
            "llama.attention.key_length": (32, VT.UINT32),
            "tokenizer.ggml.eot_token_id": (5, VT.UINT32),
        },
    )
    config = ModelConfig.from_gguf(path)
    assert config.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    assert config.head_dim == 32
    assert 5 in config.eos_token_ids[1:]


def test_gguf_linear_scaling_and_llama3_freq_factors(build, tmp_path):
    linear = rewrite_gguf(
        build("tiny-llama"), tmp_path / "linear.gguf", set_fields={"llama.rope.scale_linear": (2.0, VT.FLOAT32)}
    )
    assert ModelConfig.from_gguf(linear).rope_scaling == {"rope_type": "linear", "factor": 2.0}
    factors = np.linspace(1.0, 8.0, PRESETS["tiny-llama"].head_dim // 2, dtype=np.float32)
    llama3 = rewrite_gguf(
        build("tiny-llama"), tmp_path / "llama3.gguf", extra_tensors={"rope_freqs.weight": (factors, None)}
    )
    scaling = ModelConfig.from_gguf(llama3).rope_scaling
    assert scaling["rope_type"] == "freq_factors"
    assert scaling["freq_factors"] == factors.tolist()


def test_hf_rope_scaling_forms(build, tmp_path):
    base = json.loads((build("tiny-llama", "hf") / "config.json").read_text())
    cases = [
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, (10000.0, {"rope_type": "linear", "factor": 2.0})),
        ({"rope_scaling": {"rope_type": "default"}}, (10000.0, None)),
        (
            {"rope_theta": None, "rope_scaling": None, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}},
            (5e5, None),
        ),
    ]
    for changes, (theta, scaling) in cases:
        (tmp_path / "config.json").write_text(json.dumps({**base, **changes}))
        config = ModelConfig.from_hf(tmp_path)
        assert (config.rope_theta, config.rope_scaling) == (theta, scaling)


def test_hf_eos_from_config_and_generation_config(build, tmp_path):
    base = json.loads((build("tiny-qwen2", "hf") / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**base, "eos_token_id": [7, 3]}))
    assert ModelConfig.from_hf(tmp_path).eos_token_ids == [7, 3]  # no generation_config.json
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert ModelConfig.from_hf(tmp_path).eos_token_ids == [7, 2, 3]
    assert ModelConfig.from_hf(tmp_path).chat_template is None


def test_unsupported_architecture_is_rejected(build):
    config = ModelConfig.from_hf(build("tiny-qwen2", "hf"))
    with pytest.raises(ValueError, match="unsupported architecture 'gemma'"):
        replace(config, architecture="gemma")
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        replace(config, num_kv_heads=3)
