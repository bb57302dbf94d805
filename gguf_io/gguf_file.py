"""A fast GGUF reader: metadata with `struct` over one memory map, tensors as numpy views of it.

`gguf.GGUFReader` builds a numpy memmap view for every part of every metadata value, which takes
seconds on a real vocabulary (49,152 tokens and 48,900 merges for SmolLM2). This walks the header
once: numeric arrays become one `np.frombuffer` slice, strings are decoded in a tight loop, and
each tensor's data is a zero-copy view of the map. It offers the subset of `GGUFReader` the loader
uses: `fields[key].contents()` and `tensors` with `name`, `shape` (innermost first), `tensor_type`
and `data` (quantized types as `[rows..., bytes_per_row]` uint8, as `GGUFReader` shapes them).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType

_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRUCT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_PLAIN = {QType.F32: np.float32, QType.F16: np.float16, QType.BF16: np.uint16, QType.F64: np.float64,
          QType.I8: np.int8, QType.I16: np.int16, QType.I32: np.int32, QType.I64: np.int64}


@dataclass(frozen=True, slots=True)
class Field:
    value: Any

    def contents(self) -> Any:
        return self.value


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    shape: np.ndarray  # dims, innermost first (GGUF order)
    tensor_type: QType
    data: np.ndarray  # a read-only view of the file


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, kind: int):
        fmt = "<" + _STRUCT[kind]
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = struct.unpack_from("<Q", self.buf, self.pos)[0]
        start = self.pos + 8
        self.pos = start + n
        return str(self.buf[start:self.pos], "utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array()
        if kind in _STRUCT:
            return self.scalar(kind)
        raise ValueError(f"unknown GGUF value type {kind}")

    def array(self) -> list:
        kind, count = self.scalar(4), self.scalar(10)
        if kind in _NUMPY:
            items = np.frombuffer(self.buf, dtype=_NUMPY[kind], count=count, offset=self.pos)
            self.pos += items.nbytes
            return items.tolist()
        return [self.value(kind) for _ in range(count)]


class GGUFFile:
    """`GGUFFile(path)`: parsed header plus zero-copy tensor views; raises ValueError on a bad file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        with open(path, "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        buf = memoryview(self._map)
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic)")
        cur = _Cursor(buf)
        cur.pos = 4
        try:
            self.version, n_tensors, n_kv = cur.scalar(4), cur.scalar(10), cur.scalar(10)
            self.fields = {}
            for _ in range(n_kv):
                key = cur.string()
                self.fields[key] = Field(cur.value(cur.scalar(4)))
            infos = [self._tensor_info(cur) for _ in range(n_tensors)]
        except struct.error as exc:
            raise ValueError(f"{path}: truncated GGUF header ({exc})") from None
        alignment = self.fields.get("general.alignment", Field(32)).value
        data_start = -(-cur.pos // alignment) * alignment
        self.tensors = [self._tensor(name, dims, kind, data_start + offset) for name, dims, kind, offset in infos]

    @staticmethod
    def _tensor_info(cur: _Cursor) -> tuple[str, list[int], int, int]:
        name = cur.string()
        dims = [cur.scalar(10) for _ in range(cur.scalar(4))]
        return name, dims, cur.scalar(4), cur.scalar(10)

    def _tensor(self, name: str, dims: list[int], kind: int, offset: int) -> Tensor:
        qtype = QType(kind)
        shape = list(reversed(dims))  # numpy order: outermost first
        if qtype in _PLAIN:
            dtype, count = _PLAIN[qtype], int(np.prod(shape))
        else:
            block_size, type_size = GGML_QUANT_SIZES[qtype]
            shape[-1] = shape[-1] // block_size * type_size
            dtype, count = np.uint8, int(np.prod(shape))
        data = np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).reshape(shape)
        return Tensor(name, np.array(dims, dtype=np.uint64), qtype, data)


def open_gguf(source) -> Any:
    """`source` itself when it is already a parsed file (`GGUFFile` or `gguf.GGUFReader`), else `GGUFFile(source)`."""
    return source if hasattr(source, "fields") and hasattr(source, "tensors") else GGUFFile(source)
