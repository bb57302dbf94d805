"""Weights from a GGUF file as Hugging Face-named torch tensors, one tensor at a time.

The file is memory-mapped by ``gguf.GGUFReader``; each tensor is dequantized
(in row chunks) straight into a fresh tensor of the requested dtype, so only
one tensor's worth of extra memory is live at a time. llama.cpp's rotary
layout for the llama architecture (Q/K rows interleaved per head by
convert_hf_to_gguf.py) is undone, so the model code can stay HF/neox-style.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as QType
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize

from gguf_io.gguf_file import open_gguf
from .model_config import ModelConfig

QUANTIZED_TYPES = frozenset(
    {
        QType.Q8_0,
        QType.Q4_0,
        QType.Q4_1,
        QType.Q5_0,
        QType.Q5_1,
        QType.Q2_K,
        QType.Q3_K,
        QType.Q4_K,
        QType.Q5_K,
        QType.Q6_K,
    }
)
SUPPORTED_TYPES = frozenset({QType.F32, QType.F16, QType.BF16}) | QUANTIZED_TYPES
_CHUNK_ELEMENTS = 1 << 22  # dequantized float32 elements per chunk

_TOP_LEVEL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_PER_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Folded into ModelConfig.rope_scaling rather than yielded as a weight.
_CONFIG_TENSORS = frozenset({"rope_freqs.weight"})


def hf_name(gguf_name: str) -> str:
    """Hugging Face tensor name for a GGUF tensor name (inverse of the converter's mapping)."""
    if gguf_name in _TOP_LEVEL:
        return _TOP_LEVEL[gguf_name]
    prefix, layer, suffix = (gguf_name.split(".", 2) + ["", ""])[:3]
    if prefix != "blk" or not layer.isdigit() or suffix not in _PER_LAYER:
        raise ValueError(f"no Hugging Face name for GGUF tensor {gguf_name!r}")
    return f"model.layers.{int(layer)}.{_PER_LAYER[suffix]}"


def load_gguf(
    source: GGUFReader | str | os.PathLike[str], dtype: torch.dtype = torch.float32, keep_q4_1: bool = False
) -> tuple[ModelConfig, Iterator[tuple[str, torch.Tensor | Q4Blocks | Q8Blocks]]]:
    """(config, lazy iterator of (HF name, tensor in ``dtype``, HF shape)); validated before iterating.

    With ``keep_q4_1`` (and ``dtype`` float32), Q4_1 and Q8_0 matrices come as their ``Q4Blocks`` /
    ``Q8Blocks`` instead of dequantized, for the int4 matmuls (loaders dequantize what they cannot use). Pass one parsed file (``GGUFFile``) to both this and
    Tokenizer.from_gguf rather than a path to each.
    """
    reader = open_gguf(source)
    config = ModelConfig.from_gguf(reader)
    tensors = [t for t in reader.tensors if t.name not in _CONFIG_TENSORS]
    for t in tensors:
        _check_type(t)
    names = [hf_name(t.name) for t in tensors]
    return config, _iter_tensors(tensors, names, config, dtype, keep_q4_1 and dtype == torch.float32)


def _iter_tensors(
    tensors: list[ReaderTensor], names: list[str], config: ModelConfig, dtype: torch.dtype, keep_q4_1: bool
) -> Iterator[tuple[str, torch.Tensor | Q4Blocks]]:
    for t, name in zip(tensors, names):
        if keep_q4_1 and t.tensor_type == QType.Q4_1 and len(t.data.shape) == 2:  # rows of raw blocks reordered
            yield name, Q4Blocks(*q4_1_blocks(unpermute_qk(config, name, t.data)))
        elif keep_q4_1 and t.tensor_type == QType.Q8_0 and len(t.data.shape) == 2:
            yield name, Q8Blocks(*q8_0_blocks(unpermute_qk(config, name, t.data)))
        else:
            yield name, unpermute_qk(config, name, tensor_to_torch(t, dtype))


@dataclass(frozen=True, slots=True)
class Q4Blocks:
    """A Q4_1 matrix as its blocks: ``w = d * q + m`` for each group of 32 weights along a row."""

    q: torch.Tensor  # [out, in] uint8 in 0..15
    d: torch.Tensor  # [out, in / 32] float32
    m: torch.Tensor  # [out, in / 32] float32

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def dequantize(self) -> torch.Tensor:
        rows, groups = self.d.shape
        return (self.q.view(rows, groups, -1) * self.d[..., None] + self.m[..., None]).view(self.q.shape)

    def narrow(self, dim: int, start: int, size: int) -> Q4Blocks | torch.Tensor:
        """Rows, or whole blocks of columns, as blocks; columns that cut a block come dequantized."""
        parts = _narrow_blocks((self.q, self.d, self.m), dim, start, size)
        return Q4Blocks(*parts) if parts is not None else self.dequantize().narrow(dim, start, size)


@dataclass(frozen=True, slots=True)
class Q8Blocks:
    """A Q8_0 matrix as its blocks: ``w = d * q`` for each group of 32 weights along a row."""

    q: torch.Tensor  # [out, in] int8
    d: torch.Tensor  # [out, in / 32] float32

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def dequantize(self) -> torch.Tensor:
        rows, groups = self.d.shape
        return (self.q.view(rows, groups, -1) * self.d[..., None]).view(self.q.shape)

    def narrow(self, dim: int, start: int, size: int) -> Q8Blocks | torch.Tensor:
        parts = _narrow_blocks((self.q, self.d), dim, start, size)
        return Q8Blocks(*parts) if parts is not None else self.dequantize().narrow(dim, start, size)


BLOCK = 32  # weights per Q4_1 / Q8_0 block


def _narrow_blocks(parts: tuple[torch.Tensor, ...], dim: int, start: int, size: int) -> tuple | None:
    """(q, d[, m]) narrowed to rows, or to columns on block boundaries; None when columns cut a block."""
    q, *scales = parts
    if dim == 0:
        return tuple(t[start : start + size] for t in parts)
    if start % BLOCK or size % BLOCK:
        return None
    return (q[:, start : start + size], *(t[:, start // BLOCK : (start + size) // BLOCK] for t in scales))


def q8_0_blocks(data: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, bytes_per_row] Q8_0 bytes (per block: f16 d, 32 int8) -> (q, d)."""
    rows = data.shape[0]
    raw = np.asarray(data).reshape(rows, -1, 34)
    d = torch.from_numpy(raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32))
    q = torch.from_numpy(np.ascontiguousarray(raw[..., 2:]).view(np.int8).reshape(rows, -1))
    return q, d


def q4_1_blocks(data: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[rows, bytes_per_row] Q4_1 bytes (per block: f16 d, f16 m, 16 bytes of nibbles; low nibbles are
    weights 0..15, high nibbles 16..31) -> (q, d, m), vectorized over the whole matrix."""
    rows = data.shape[0]
    raw = np.asarray(data).reshape(rows, -1, 20)
    d = torch.from_numpy(raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32))
    m = torch.from_numpy(raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
    nibbles = raw[..., 4:]
    q = np.empty((rows, raw.shape[1], 32), dtype=np.uint8)
    np.bitwise_and(nibbles, 15, out=q[..., :16])
    np.right_shift(nibbles, 4, out=q[..., 16:])
    return torch.from_numpy(q.reshape(rows, -1)), d, m


def _check_type(t: ReaderTensor) -> None:
    if t.tensor_type not in SUPPORTED_TYPES:
        supported = ", ".join(sorted(q.name for q in SUPPORTED_TYPES))
        raise ValueError(
            f"GGUF tensor {t.name!r} has type {t.tensor_type.name}, which this loader cannot dequantize "
            f"(supported: {supported})"
        )


def tensor_shape(t: ReaderTensor) -> tuple[int, ...]:
    """GGUF stores dims innermost first; HF/torch order is the reverse ([out, in])."""
    return tuple(int(d) for d in reversed(t.shape.tolist()))


def tensor_to_torch(t: ReaderTensor, dtype: torch.dtype) -> torch.Tensor:
    """One GGUF tensor as a new torch tensor of ``dtype`` in HF shape."""
    _check_type(t)
    shape = tensor_shape(t)
    if t.tensor_type in QUANTIZED_TYPES:
        return _dequantize(t, shape, dtype)
    data = np.asarray(t.data)
    if t.tensor_type == QType.BF16:
        raw = torch.from_numpy(np.array(data).view(np.int16)).view(torch.bfloat16)
    else:
        raw = torch.from_numpy(np.array(data))  # copies out of the read-only memory map
    return raw.reshape(shape).to(dtype)


def _dequantize(t: ReaderTensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    # t.data: [rows, bytes_per_row] uint8 view of the memory map
    blocks = np.asarray(t.data).reshape(-1, t.data.shape[-1])
    cols = shape[-1]
    out = torch.empty((blocks.shape[0], cols), dtype=dtype)
    step = max(1, _CHUNK_ELEMENTS // cols)
    for start in range(0, blocks.shape[0], step):
        chunk = dequantize(blocks[start : start + step], t.tensor_type)  # [step, cols] float32
        out[start : start + step] = torch.from_numpy(chunk)
    return out.reshape(shape)


def unpermute_qk(config: ModelConfig, name: str, tensor: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
    """Undo convert_hf_to_gguf.py's llama Q/K row permutation (interleaved -> rotate-half per head).
    A numpy array is a quantized matrix's rows of raw blocks (each row whole blocks), reordered as they are."""
    if config.architecture != "llama":
        return tensor
    if ".self_attn.q_proj." in name:
        return _unpermute(tensor, config.num_heads)
    if ".self_attn.k_proj." in name:
        return _unpermute(tensor, config.num_kv_heads)
    return tensor


def _unpermute(tensor: torch.Tensor | np.ndarray, n_head: int) -> torch.Tensor | np.ndarray:
    # tensor: [n_head * head_dim, ...]; GGUF rows per head are (pair, half) -> HF (half, pair)
    rows = tensor.shape[0]
    order = np.arange(rows).reshape(n_head, rows // n_head // 2, 2).transpose(0, 2, 1).reshape(-1)
    if isinstance(tensor, np.ndarray):
        return np.asarray(tensor)[order]  # a row gather out of the memory map
    return tensor.index_select(0, torch.from_numpy(order))  # a row gather: one pass, any dtype
