"""The one GGUF reader: metadata with `struct` over one memory map, tensors as numpy views of it.

`gguf.GGUFReader` builds a numpy memmap view for every part of every metadata value, which takes
seconds on a real vocabulary (49,152 tokens and 48,900 merges for SmolLM2). This walks the header
once: numeric arrays become one `np.frombuffer` slice, strings are decoded in a tight loop.

- `read_header(path, max_array=32)`: metadata scalars and tensor shapes without touching the weights
  (the registry, `/api/show`, `infer estimate`); arrays longer than `max_array` are skipped and read
  as `[]`, as Ollama's `model_info` shows them.
- `check_layout(header, file_size)`: every tensor's data lies inside the file, aligned, with a known
  type (a file cut short, or a header that lies, is refused before a model is made of it).
- `GGUFFile(path)`: the subset of `GGUFReader` the engine's loader uses: `fields[key].contents()` and
  `tensors` with `name`, `shape` (innermost first), `tensor_type` and `data`, a zero-copy view of the
  map (quantized types as `[rows..., bytes_per_row]` uint8, as `GGUFReader` shapes them).

A header is refused with a ValueError naming the field: bad magic, a GGUF version other than 2 or 3,
a truncated header, an unknown value type, an array longer than the bytes left could hold.
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
_SMALLEST_ITEM = {_STRING: 8, _ARRAY: 12}  # bytes an element takes at least: a length; a type and a count
_PLAIN = {QType.F32: np.float32, QType.F16: np.float16, QType.BF16: np.uint16, QType.F64: np.float64,
          QType.I8: np.int8, QType.I16: np.int16, QType.I32: np.int32, QType.I64: np.int64}
VERSIONS = (2, 3)  # the GGUF versions with 64-bit counts, as llama.cpp reads them (1 had 32-bit ones)
EVERY_ARRAY = 1 << 63  # max_array that reads every array whole


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # dims, innermost first (GGUF order)
    ggml_type: int
    offset: int = 0  # of its data, from the start of the data section


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict
    tensors: list[TensorInfo]
    data_start: int = 0  # where the tensor data begins in the file

    @property
    def alignment(self) -> int:
        value = self.metadata.get("general.alignment", 32)
        return value if isinstance(value, int) and value > 0 else 32


class _Cursor:
    def __init__(self, buf: memoryview, max_array: int) -> None:
        self.buf, self.pos, self.max_array = buf, 0, max_array

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
        smallest = struct.calcsize(_STRUCT[kind]) if kind in _STRUCT else _SMALLEST_ITEM.get(kind, 1)
        left = len(self.buf) - self.pos
        if count * smallest > left:
            raise ValueError(f"an array of {count} elements cannot fit in the {left} bytes left in the file")
        keep = count <= self.max_array
        if kind in _NUMPY:
            items = np.frombuffer(self.buf, dtype=_NUMPY[kind], count=count, offset=self.pos).tolist() if keep else []
            self.pos += count * smallest
            return items
        if kind == _STRING:
            return [self.string() for _ in range(count)] if keep else self.skip_strings(count)
        items = [self.value(kind) for _ in range(count)]
        return items if keep else []

    def skip_strings(self, count: int) -> list:
        for _ in range(count):
            self.pos += 8 + struct.unpack_from("<Q", self.buf, self.pos)[0]
        return []

    def tensor(self) -> TensorInfo:
        name = self.string()
        dims = tuple(self.scalar(10) for _ in range(self.scalar(4)))
        ggml_type = self.scalar(4)
        return TensorInfo(name, dims, ggml_type, self.scalar(10))


def parse_header(buf: memoryview, max_array: int = EVERY_ARRAY) -> GGUFHeader:
    """The header at the start of ``buf`` (a whole GGUF file); ValueError names what is wrong."""
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError("not a GGUF file (bad magic)")
    cur = _Cursor(buf, max_array)
    cur.pos = 4
    try:
        version = cur.scalar(4)
        if version not in VERSIONS:
            raise ValueError(f"field 'version': GGUF version {version} is not one this reader knows "
                             f"({', '.join(map(str, VERSIONS))})")
        n_tensors, n_kv = cur.scalar(10), cur.scalar(10)
        metadata = {}
        for _ in range(n_kv):
            key = cur.string()
            try:
                metadata[key] = cur.value(cur.scalar(4))
            except ValueError as exc:
                raise ValueError(f"metadata field {key!r}: {exc}") from None
        tensors = [cur.tensor() for _ in range(n_tensors)]
    except struct.error as exc:
        raise ValueError(f"truncated header: {exc}") from None
    align = GGUFHeader(version, metadata, []).alignment
    return GGUFHeader(version, metadata, tensors, data_start=-(-cur.pos // align) * align)


def read_header(path: str | os.PathLike[str], *, max_array: int = 32) -> GGUFHeader:
    """The header of the file at ``path``, arrays longer than ``max_array`` read as ``[]``."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        with memoryview(mapped) as buf:
            return parse_header(buf, max_array)


def check_layout(header: GGUFHeader, file_size: int) -> None:
    """ValueError unless every tensor's data is in the file, aligned, with a known type and whole blocks."""
    for tensor in header.tensors:
        try:
            block, block_bytes = GGML_QUANT_SIZES[QType(tensor.ggml_type)]
        except (ValueError, KeyError):
            raise ValueError(f"tensor {tensor.name!r} has an unknown type {tensor.ggml_type}") from None
        count = 1
        for dim in tensor.shape:
            count *= dim
        if count % block:
            raise ValueError(f"tensor {tensor.name!r} of shape {list(tensor.shape)} is not whole blocks of {block}")
        start = header.data_start + tensor.offset
        end = start + count // block * block_bytes
        if tensor.offset % header.alignment:
            raise ValueError(f"tensor {tensor.name!r} is not aligned to {header.alignment} bytes")
        if end > file_size:
            raise ValueError(f"tensor {tensor.name!r} ends at byte {end}, past the end of the file ({file_size} "
                             "bytes): the file is cut short or damaged")


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


class GGUFFile:
    """`GGUFFile(path)`: parsed header plus zero-copy tensor views; raises ValueError on a bad file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        with open(path, "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            header = parse_header(memoryview(self._map))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        self.version = header.version
        self.fields = {key: Field(value) for key, value in header.metadata.items()}
        self.tensors = [self._tensor(info, header.data_start + info.offset) for info in header.tensors]

    def _tensor(self, info: TensorInfo, offset: int) -> Tensor:
        qtype = QType(info.ggml_type)
        shape = list(reversed(info.shape))  # numpy order: outermost first
        if qtype in _PLAIN:
            dtype, count = _PLAIN[qtype], int(np.prod(shape))
        else:
            block_size, type_size = GGML_QUANT_SIZES[qtype]
            shape[-1] = shape[-1] // block_size * type_size
            dtype, count = np.uint8, int(np.prod(shape))
        data = np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).reshape(shape)
        return Tensor(info.name, np.array(info.shape, dtype=np.uint64), qtype, data)


def open_gguf(source) -> Any:
    """`source` itself when it is already a parsed file (`GGUFFile` or `gguf.GGUFReader`), else `GGUFFile(source)`."""
    return source if hasattr(source, "fields") and hasattr(source, "tensors") else GGUFFile(source)
