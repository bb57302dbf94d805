"""Hugging Face checkpoint directory: config, weights, tokenizer, generation config."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from . import safetensors_out
from .spec import ModelSpec
from .tokenizer import CHATML_TEMPLATE, ENDOFTEXT, IM_END, padded_tokenizer, special_ids
from .weights import make_tensor, tensor_specs

HF_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
ARCH_CLASSES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


def hf_config(spec: ModelSpec, dtype: str, ids: dict[str, int]) -> dict[str, Any]:
    """``config.json`` contents for Qwen2ForCausalLM / LlamaForCausalLM."""
    config: dict[str, Any] = {
        "architectures": [ARCH_CLASSES[spec.arch]],
        "model_type": spec.arch,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.context_length,
        "rms_norm_eps": spec.rms_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": spec.tie_embeddings,
        "attention_dropout": 0.0,
        "initializer_range": spec.init_std,
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": ids[IM_END],
        "torch_dtype": HF_DTYPES[dtype],
        "use_cache": True,
    }
    if spec.arch == "qwen2":
        config |= {"use_sliding_window": False, "sliding_window": None, "max_window_layers": spec.num_layers}
    else:
        config |= {"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}
    return config


def generation_config(ids: dict[str, int]) -> dict[str, Any]:
    return {
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": [ids[IM_END], ids[ENDOFTEXT]],
        "pad_token_id": ids[ENDOFTEXT],
    }


def tokenizer_config(spec: ModelSpec) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": ENDOFTEXT,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": spec.context_length,
        "chat_template": CHATML_TEMPLATE,
    }


def _dump_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_dir(tmp: Path, spec: ModelSpec, seed: int, dtype: str) -> None:
    tok = padded_tokenizer(spec.vocab_size, spec.tokenizer_vocab_size)
    ids = special_ids(tok)
    _dump_json(tmp / "config.json", hf_config(spec, dtype, ids))
    _dump_json(tmp / "generation_config.json", generation_config(ids))
    _dump_json(tmp / "tokenizer_config.json", tokenizer_config(spec))
    (tmp / "tokenizer.json").write_text(tok.to_str(pretty=True), encoding="utf-8")
    safetensors_out.save(
        tmp / "model.safetensors", tensor_specs(spec), lambda ts: make_tensor(spec, ts, seed), dtype
    )


def build_hf(out_dir: str | os.PathLike[str], spec: ModelSpec, *, seed: int = 0, dtype: str = "f32") -> Path:
    """Write a Hugging Face checkpoint directory for ``spec``; returns the directory.

    The directory is assembled next to ``out_dir`` and moved into place, replacing
    an existing directory of that name. Same spec and seed give identical files.
    """
    if dtype not in HF_DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r} for hf output; choose from {', '.join(HF_DTYPES)}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write_dir(tmp, spec, seed, dtype)
        if out.exists():
            shutil.rmtree(out)
        tmp.chmod(0o755)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
