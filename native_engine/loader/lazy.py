"""Checkpoint tensors not read yet, for tensor-parallel ranks: each rank reads only its shard.

`lazy_gguf` / `lazy_hf` yield `(HF name, weight)` like `load_gguf` / `load_hf`, but each weight is a handle:
`weight.narrow(dim, start, size)` reads just those rows or columns (`load()` the whole tensor, for what is
replicated: norms). So no rank ever holds more of a matrix than its shard, and a quantized GGUF file is
sliced before it is dequantized:

- rows of a quantized matrix are rows of raw blocks out of the memory map (Q4_1 / Q8_0 kept as blocks for
  the CPU kernels when asked, others dequantized row by row);
- columns on block boundaries are a byte range of each row (again kept as blocks or dequantized); columns
  that cut a block are dequantized a chunk of rows at a time, keeping only the slice;
- llama's Q/K rows, which the GGUF converter interleaves within each head, are un-interleaved per head on
  the slice (a slice always holds whole heads).

The layers narrow with `narrow` below, which takes these handles, plain tensors and `Q4Blocks`/`Q8Blocks`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType
from gguf import ReaderTensor
from gguf.quants import dequantize
from safetensors import safe_open

from gguf_io.gguf_file import open_gguf
from .gguf_loader import (_CHUNK_ELEMENTS, _CONFIG_TENSORS, QUANTIZED_TYPES, Q4Blocks, Q8Blocks, _check_type,
                          _unpermute, hf_name, q4_1_blocks, q8_0_blocks, tensor_shape)
from .hf_loader import _SKIPPED_SUFFIXES, safetensors_files
from .model_config import ModelConfig


def narrow(loaded, dim: int, start: int, size: int):
    """Rows (``dim`` 0) or columns (``dim`` 1) of a tensor, blocks or lazy weight; itself when it is all."""
    if start == 0 and size == loaded.shape[dim]:
        return loaded
    return loaded.narrow(dim, start, size)


def materialize(loaded):
    """The tensor (or blocks) a lazy weight stands for; anything else as it is."""
    return loaded.load() if isinstance(loaded, (GGUFWeight, SafetensorsWeight)) else loaded


@dataclass(frozen=True, slots=True)
class GGUFWeight:
    tensor: ReaderTensor
    name: str  # the Hugging Face name
    config: ModelConfig
    dtype: torch.dtype
    keep_blocks: bool  # Q4_1 / Q8_0 come as Q4Blocks / Q8Blocks (float32 compute on CPU)

    @property
    def shape(self) -> tuple[int, ...]:
        return tensor_shape(self.tensor)

    def load(self):
        return self.narrow(0, 0, self.shape[0])

    def narrow(self, dim: int, start: int, size: int):
        if dim == 0:
            return self._rows(start, size)
        assert dim == 1 and len(self.shape) == 2, (self.name, dim)
        return self._columns(start, size)

    def _rows(self, start: int, size: int):
        t = self.tensor
        data = np.asarray(t.data)
        rows = data.reshape(self.shape[0], -1)[start : start + size] if data.ndim > 1 else data[start : start + size]
        rows = self._unpermute(rows, start, size)
        if t.tensor_type in QUANTIZED_TYPES:
            return self._from_blocks(rows, rows.shape[0])
        return _plain(rows, t.tensor_type, self.dtype).reshape(size, *self.shape[1:])

    def _columns(self, start: int, size: int):
        t = self.tensor
        out_rows, cols = self.shape
        data = np.asarray(t.data).reshape(out_rows, -1)
        if t.tensor_type not in QUANTIZED_TYPES:
            return _plain(data[:, start : start + size], t.tensor_type, self.dtype)
        block, type_size = GGML_QUANT_SIZES[t.tensor_type]
        if start % block == 0 and (size % block == 0 or start + size == cols):
            raw = data[:, start // block * type_size : -(-(start + size) // block) * type_size]
            return self._from_blocks(raw, out_rows)
        return self._dequantized_columns(data, start, size)

    def _from_blocks(self, raw: np.ndarray, rows: int):
        kind = self.tensor.tensor_type
        if self.keep_blocks and kind == QType.Q4_1:
            return Q4Blocks(*q4_1_blocks(raw))
        if self.keep_blocks and kind == QType.Q8_0:
            return Q8Blocks(*q8_0_blocks(raw))
        values = torch.from_numpy(dequantize(np.ascontiguousarray(raw), kind)).to(self.dtype)
        return values.reshape(rows, -1) if len(self.shape) > 1 else values.reshape(-1)

    def _dequantized_columns(self, data: np.ndarray, start: int, size: int) -> torch.Tensor:
        out = torch.empty(data.shape[0], size, dtype=self.dtype)
        step = max(1, _CHUNK_ELEMENTS // self.shape[1])
        for first in range(0, data.shape[0], step):
            chunk = dequantize(data[first : first + step], self.tensor.tensor_type)  # [step, cols] float32
            out[first : first + step] = torch.from_numpy(chunk[:, start : start + size])
        return out

    def _unpermute(self, rows: np.ndarray, start: int, size: int) -> np.ndarray:
        """llama's GGUF Q/K rows are interleaved within each head: undo it on the slice (whole heads)."""
        if self.config.architecture != "llama":
            return rows
        if ".self_attn.q_proj." not in self.name and ".self_attn.k_proj." not in self.name:
            return rows
        head_dim = self.config.head_dim
        assert start % head_dim == 0 and size % head_dim == 0, f"{self.name}: rows {start}+{size} cut a head"
        return _unpermute(rows, size // head_dim)


def _plain(data: np.ndarray, kind: QType, dtype: torch.dtype) -> torch.Tensor:
    if kind == QType.BF16:
        return torch.from_numpy(np.array(data).view(np.int16)).view(torch.bfloat16).to(dtype)
    return torch.from_numpy(np.array(data)).to(dtype)  # copies out of the read-only memory map


def lazy_gguf(source, dtype: torch.dtype = torch.float32, keep_q4_1: bool = False
              ) -> tuple[ModelConfig, Iterator[tuple[str, GGUFWeight]]]:
    """``load_gguf``'s (config, weights), each weight a `GGUFWeight`."""
    reader = open_gguf(source)
    config = ModelConfig.from_gguf(reader)
    tensors = [t for t in reader.tensors if t.name not in _CONFIG_TENSORS]
    for t in tensors:
        _check_type(t)
    keep = keep_q4_1 and dtype == torch.float32
    return config, ((hf_name(t.name), GGUFWeight(t, hf_name(t.name), config, dtype, keep)) for t in tensors)


@dataclass(frozen=True, slots=True)
class SafetensorsWeight:
    file: Path
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    def load(self) -> torch.Tensor:
        with safe_open(self.file, framework="pt") as f:
            return f.get_tensor(self.name).to(self.dtype)

    def narrow(self, dim: int, start: int, size: int) -> torch.Tensor:
        with safe_open(self.file, framework="pt") as f:
            part = f.get_slice(self.name)
            piece = part[start : start + size] if dim == 0 else part[:, start : start + size]
        return piece.to(self.dtype)


def lazy_hf(path: str | os.PathLike[str], dtype: torch.dtype = torch.float32
            ) -> tuple[ModelConfig, Iterator[tuple[str, SafetensorsWeight]]]:
    """``load_hf``'s (config, weights), each weight a `SafetensorsWeight`."""
    config = ModelConfig.from_hf(path)
    return config, _iter_safetensors(safetensors_files(path), dtype)


def _iter_safetensors(files: list[Path], dtype: torch.dtype) -> Iterator[tuple[str, SafetensorsWeight]]:
    for file in files:
        with safe_open(file, framework="pt") as shard:
            names = [n for n in shard.keys() if not n.endswith(_SKIPPED_SUFFIXES)]  # noqa: SIM118
            shapes = {n: tuple(shard.get_slice(n).get_shape()) for n in names}
        for name in names:
            yield name, SafetensorsWeight(file, name, dtype, shapes[name])
