"""GGUF output with the metadata and tensor layout llama.cpp expects.

Tensors are converted the way ``convert_hf_to_gguf.py`` converts a Hugging
Face checkpoint of the same model, so the GGUF and HF outputs of one spec and
seed compute the same logits. Tensor data is generated and written one tensor
at a time.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType
from tokenizers import Tokenizer

from .spec import ModelSpec
from .tokenizer import (
    CHATML_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    id_to_token_list,
    merges,
    num_regular_tokens,
    padded_tokenizer,
    special_ids,
)
from .weights import TensorSpec, make_tensor, tensor_specs

FILE_TYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
}
LICENSE = "apache-2.0"
# llama.cpp selects its pre-tokenizer regex by this name; "qwen2" is the
# Qwen2 split pattern our tokenizer.json uses.
TOKENIZER_PRE = "qwen2"

_TOP_LEVEL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_PER_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf_name: str) -> str:
    """GGUF tensor name for a Hugging Face tensor name."""
    if hf_name in _TOP_LEVEL:
        return _TOP_LEVEL[hf_name]
    prefix, _, rest = hf_name.partition(".layers.")
    layer, _, suffix = rest.partition(".")
    if prefix != "model" or suffix not in _PER_LAYER:
        raise KeyError(f"no GGUF name for tensor {hf_name!r}")
    return f"blk.{int(layer)}.{_PER_LAYER[suffix]}"


def permute_qk(weights: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half RoPE rows -> llama.cpp interleaved RoPE rows (as convert_hf_to_gguf.py)."""
    rows = weights.shape[0]
    return weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def hf_to_gguf_values(spec: ModelSpec, hf_name: str, values: np.ndarray) -> np.ndarray:
    """Apply the llama-arch Q/K permutation; other tensors pass through."""
    if spec.arch != "llama":
        return values
    if hf_name.endswith("self_attn.q_proj.weight"):
        return permute_qk(values, spec.num_heads)
    if hf_name.endswith("self_attn.k_proj.weight"):
        return permute_qk(values, spec.num_kv_heads)
    return values


@dataclass(frozen=True)
class _Planned:
    hf: TensorSpec
    name: str
    qtype: QType


def _storage_type(ts: TensorSpec, dtype: str) -> QType:
    """Norms, biases and all 1-D tensors stay F32; matrices follow ``dtype``."""
    if len(ts.shape) == 1 or dtype == "f32":
        return QType.F32
    quantized = {"q8_0": QType.Q8_0, "q4_0": QType.Q4_0}.get(dtype)
    if quantized is not None and ts.shape[-1] % gguf.GGML_QUANT_SIZES[quantized][0] == 0:
        return quantized
    return QType.F16


def _encode(values: np.ndarray, qtype: QType) -> np.ndarray:
    if qtype == QType.F32:
        return np.ascontiguousarray(values, dtype=np.float32)
    if qtype == QType.F16:
        return values.astype(np.float16)
    return gguf.quants.quantize(values, qtype)


def _byte_size(shape: tuple[int, ...], qtype: QType) -> tuple[tuple[int, ...], np.dtype, int]:
    if qtype in (QType.F32, QType.F16):
        np_dtype = np.dtype(np.float32 if qtype == QType.F32 else np.float16)
        return shape, np_dtype, int(np.prod(shape)) * np_dtype.itemsize
    byte_shape = gguf.quants.quant_shape_to_byte_shape(shape, qtype)
    return byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape))


def _add_model_metadata(w: gguf.GGUFWriter, spec: ModelSpec, dtype: str) -> None:
    w.add_type("model")
    w.add_name(spec.name)
    w.add_license(LICENSE)
    w.add_file_type(int(FILE_TYPES[dtype]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_vocab_size(spec.vocab_size)
    w.add_context_length(spec.context_length)
    w.add_embedding_length(spec.hidden_size)
    w.add_block_count(spec.num_layers)
    w.add_feed_forward_length(spec.intermediate_size)
    w.add_head_count(spec.num_heads)
    w.add_head_count_kv(spec.num_kv_heads)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.rms_eps)


def token_types(tok: Tokenizer) -> list[gguf.TokenType]:
    """NORMAL for BPE tokens, CONTROL for the ChatML specials, USER_DEFINED for padding tokens."""
    n_regular = num_regular_tokens(tok)
    control = set(special_ids(tok).values())
    kinds = (gguf.TokenType.NORMAL, gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED)
    return [kinds[0] if i < n_regular else kinds[1] if i in control else kinds[2] for i in range(tok.get_vocab_size())]


def _add_tokenizer_metadata(w: gguf.GGUFWriter, spec: ModelSpec) -> None:
    tok = padded_tokenizer(spec.vocab_size, spec.tokenizer_vocab_size)
    tokens = id_to_token_list(tok)
    if len(tokens) != spec.vocab_size:
        raise ValueError(f"tokenizer has {len(tokens)} tokens, spec vocab_size is {spec.vocab_size}")
    ids = special_ids(tok)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(TOKENIZER_PRE)
    w.add_token_list(tokens)
    w.add_token_types(token_types(tok))
    w.add_token_merges(merges(tok))
    w.add_bos_token_id(ids[ENDOFTEXT])
    w.add_eos_token_id(ids[IM_END])
    w.add_pad_token_id(ids[ENDOFTEXT])
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)


def _plan(spec: ModelSpec, dtype: str) -> list[_Planned]:
    return [_Planned(ts, gguf_name(ts.name), _storage_type(ts, dtype)) for ts in tensor_specs(spec)]


def _write(path: Path, spec: ModelSpec, dtype: str, produce: Callable[[TensorSpec], np.ndarray]) -> None:
    w = gguf.GGUFWriter(path, spec.arch)
    _add_model_metadata(w, spec, dtype)
    _add_tokenizer_metadata(w, spec)
    plan = _plan(spec, dtype)
    for p in plan:
        shape, np_dtype, nbytes = _byte_size(p.hf.shape, p.qtype)
        raw = None if p.qtype in (QType.F32, QType.F16) else p.qtype
        w.add_tensor_info(p.name, shape, np_dtype, nbytes, raw_dtype=raw)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for p in plan:
            w.write_tensor_data(_encode(hf_to_gguf_values(spec, p.hf.name, produce(p.hf)), p.qtype))
    finally:
        w.close()


def build_gguf(out_path: str | os.PathLike[str], spec: ModelSpec, *, dtype: str = "f32", seed: int = 0,
               produce: Callable[[TensorSpec], np.ndarray] | None = None) -> Path:
    """Write ``spec`` with random weights from ``seed`` as a GGUF file; returns its path.

    ``dtype`` is ``"f32"``, ``"f16"``, ``"q8_0"`` or ``"q4_0"`` (matrices only; norms and
    biases stay F32). ``produce`` gives each tensor's values instead (HF layout; a model with a
    LoRA adapter merged in: ``lora_out.build_merged_gguf``). The file is written to a temporary
    name and renamed.
    """
    if dtype not in FILE_TYPES:
        raise ValueError(f"unsupported dtype {dtype!r} for gguf output; choose from {', '.join(FILE_TYPES)}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _write(tmp, spec, dtype, produce or (lambda ts: make_tensor(spec, ts, seed)))
        tmp.chmod(0o644)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out
