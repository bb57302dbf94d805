"""Model hyper-parameters from GGUF metadata or a Hugging Face checkpoint directory."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader

from gguf_io.gguf_file import open_gguf
from gguf_io.metadata import gguf_eos_token_ids, gguf_value, hf_chat_template, hf_eos_token_ids, read_json

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
_HF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


@dataclass(slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None
    torch_dtype: str | None = None  # how the checkpoint stores matrices: float32, float16, bfloat16 or quantized

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads <= 0 or self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")

    @classmethod
    def from_gguf(cls, source: GGUFReader | str | os.PathLike[str]) -> ModelConfig:
        reader = open_gguf(source)
        arch = gguf_value(reader, "general.architecture")
        if arch is None:
            raise ValueError("GGUF file has no general.architecture")

        def get(key: str, default: Any = None) -> Any:
            return gguf_value(reader, f"{arch}.{key}", default)

        names = {t.name for t in reader.tensors}
        tokens = gguf_value(reader, "tokenizer.ggml.tokens") or []
        hidden, heads = get("embedding_length"), get("attention.head_count")
        return cls(
            architecture=arch,
            vocab_size=len(tokens) or _embedding_rows(reader),
            hidden_size=hidden,
            intermediate_size=get("feed_forward_length"),
            num_layers=get("block_count"),
            num_heads=heads,
            num_kv_heads=_uniform(get("attention.head_count_kv", heads)),
            head_dim=get("attention.key_length", hidden // heads),
            max_position_embeddings=get("context_length"),
            rms_norm_eps=_f32(get("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=_f32(get("rope.freq_base", 10000.0)),
            rope_scaling=_gguf_rope_scaling(reader, arch),
            tie_word_embeddings="output.weight" not in names,
            qkv_bias="blk.0.attn_q.bias" in names,
            bos_token_id=gguf_value(reader, "tokenizer.ggml.bos_token_id"),
            eos_token_ids=gguf_eos_token_ids(reader, tokens),
            chat_template=gguf_value(reader, "tokenizer.chat_template"),
            torch_dtype=_GGUF_FILE_TYPES.get(gguf_value(reader, "general.file_type"), "quantized"),
        )

    @classmethod
    def from_hf(cls, path: str | os.PathLike[str]) -> ModelConfig:
        root = Path(path)
        config = read_json(root / "config.json")
        heads = config["num_attention_heads"]
        arch = _hf_architecture(config)
        theta, scaling = _hf_rope(config)
        return cls(
            architecture=arch,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2" or bool(config.get("attention_bias", False)),
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=hf_eos_token_ids(root, config),
            chat_template=hf_chat_template(root),
            torch_dtype=config.get("torch_dtype") or config.get("dtype"),
        )


# general.file_type (llama.cpp's LLAMA_FTYPE) of unquantized files.
_GGUF_FILE_TYPES = {0: "float32", 1: "float16", 32: "bfloat16"}


def _f32(value: float) -> float:
    """GGUF stores float32: take the shortest decimal that round-trips (1e-06, not 9.99999997e-07)."""
    return float(str(np.float32(value)))


def _uniform(value: int | list[int]) -> int:
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ValueError(f"per-layer head_count_kv {value} is not supported")
        return value[0]
    return value


def _embedding_rows(reader: GGUFReader) -> int:
    for t in reader.tensors:
        if t.name == "token_embd.weight":
            return int(t.shape[-1])
    raise ValueError("GGUF file has neither a token list nor token_embd.weight")


def _gguf_rope_scaling(reader: GGUFReader, arch: str) -> dict[str, Any] | None:
    """HF-style rope_scaling from {arch}.rope.scaling.* (or the rope_freqs tensor of Llama 3.x)."""
    kind = gguf_value(reader, f"{arch}.rope.scaling.type")
    factor = gguf_value(reader, f"{arch}.rope.scaling.factor")
    if kind is None and gguf_value(reader, f"{arch}.rope.scale_linear") is not None:
        kind, factor = "linear", gguf_value(reader, f"{arch}.rope.scale_linear")
    if kind not in (None, "none") and factor not in (None, 0.0, 1.0):
        out: dict[str, Any] = {"rope_type": kind, "factor": _f32(factor)}
        original = gguf_value(reader, f"{arch}.rope.scaling.original_context_length")
        if original:
            out["original_max_position_embeddings"] = original
        return out
    return _rope_freq_factors(reader)


def _rope_freq_factors(reader: GGUFReader) -> dict[str, Any] | None:
    """llama.cpp bakes Llama 3.x rope scaling into per-frequency divisors: inv_freq[i] /= freq_factors[i]."""
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            return {"rope_type": "freq_factors", "freq_factors": [float(x) for x in np.asarray(t.data).ravel()]}
    return None


def _hf_architecture(config: dict[str, Any]) -> str:
    for name in config.get("architectures") or []:
        if name in _HF_ARCHITECTURES:
            return _HF_ARCHITECTURES[name]
    return config.get("model_type", "")


def _hf_rope(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """rope_theta and rope_scaling; accepts both rope_scaling and transformers v5 rope_parameters."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", config.get("rope_theta", 10000.0)))
    kind = params.pop("rope_type", params.pop("type", None))
    if kind in (None, "default") or not params:
        return theta, None
    return theta, {"rope_type": kind, **params}
