"""Model hyper-parameters from GGUF metadata or a Hugging Face checkpoint directory."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader

from gguf_io.gguf_file import open_gguf

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
# Token texts llama.cpp treats as end-of-generation whatever the metadata says (llama-vocab.cpp).
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
        "<EOT>", "_<EOT>", "<|end_of_text|>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
    }
)  # fmt: skip
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


def gguf_value(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """A metadata value as a Python object (str, number, bool or list), or ``default``."""
    field_ = reader.fields.get(key)
    return default if field_ is None else field_.contents()


def ordered_eos(primary: int | None, others: list[int]) -> list[int]:
    """The primary EOS first, then the other ids ascending, without duplicates."""
    head = [] if primary is None else [primary]
    return head + sorted(set(others) - set(head))


def gguf_eos_token_ids(reader: GGUFReader, tokens: list[str]) -> list[int]:
    """tokenizer.ggml.eos/eot/eom ids plus the tokens llama.cpp treats as end-of-generation by text."""
    ids = [gguf_value(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
    ids += [i for i, text in enumerate(tokens) if text in EOG_TEXTS]
    return ordered_eos(gguf_value(reader, "tokenizer.ggml.eos_token_id"), [i for i in ids if i is not None])


def hf_eos_token_ids(root: Path, config: dict[str, Any]) -> list[int]:
    """config.json eos_token_id (first is primary) plus generation_config.json's."""
    ids = _as_list(config.get("eos_token_id"))
    gen_path = root / "generation_config.json"
    extra = _as_list(read_json(gen_path).get("eos_token_id")) if gen_path.exists() else []
    primary = ids[0] if ids else (extra[0] if extra else None)
    return ordered_eos(primary, ids + extra)


def hf_chat_template(root: Path) -> str | None:
    jinja = root / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    tok_config = root / "tokenizer_config.json"
    template = read_json(tok_config).get("chat_template") if tok_config.exists() else None
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default")
    return template


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _as_list(value: int | list[int] | None) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


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
