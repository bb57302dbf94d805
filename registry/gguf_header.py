"""A fast GGUF header reader: metadata scalars and tensor shapes without touching the weights.

``gguf.GGUFReader`` builds Python objects for every element of every array, which takes seconds on
a real vocabulary (151,936 tokens for Qwen2). Serving needs only the scalars and tensor shapes, so
this walks the header with ``struct`` over an mmap and keeps arrays only up to ``max_array``
elements (longer ones become ``[]``, as Ollama's ``model_info`` shows them).

``check_layout(header, file_size)`` checks what the header says about the weights against the file:
every tensor's data lies inside it, aligned, with a known type (a file cut short, or a header that
lies, is refused before a model is made of it).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

# GGUF value types -> struct format (scalars); 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
VERSIONS = (2, 3)  # the GGUF versions with 64-bit counts, as llama.cpp reads them (1 had 32-bit ones)
_SMALLEST_ITEM = {_STRING: 8, _ARRAY: 12}  # bytes an element takes at least: a length; a type and a count


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
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
    def __init__(self, buf) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str):
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return bytes(raw).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        self.pos += 8 + struct.unpack_from("<Q", self.buf, self.pos)[0]

    def value(self, kind: int, max_array: int):
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array(max_array)
        raise ValueError(f"unknown GGUF value type {kind}")

    def array(self, max_array: int) -> list:
        kind, count = self.scalar("I"), self.scalar("Q")
        smallest = struct.calcsize(_SCALARS[kind]) if kind in _SCALARS else _SMALLEST_ITEM.get(kind, 1)
        left = len(self.buf) - self.pos
        if count * smallest > left:
            raise ValueError(f"an array of {count} elements cannot fit in the {left} bytes left in the file")
        if count <= max_array:
            return [self.value(kind, max_array) for _ in range(count)]
        if kind in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[kind])
        elif kind == _STRING:
            for _ in range(count):
                self.skip_string()
        else:
            for _ in range(count):
                self.array(0)
        return []


def read_header(path: Path, *, max_array: int = 32) -> GGUFHeader:
    """Parse the header; raises ``ValueError`` (bad magic, an unknown version, truncated file, unknown
    type, an array longer than the bytes left could hold), naming the field."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError("bad magic")
        cur = _Cursor(buf)
        cur.pos = 4
        try:
            version = cur.scalar("I")
            if version not in VERSIONS:
                raise ValueError(f"field 'version': GGUF version {version} is not one this reader knows "
                                 f"({', '.join(map(str, VERSIONS))})")
            n_tensors, n_kv = cur.scalar("Q"), cur.scalar("Q")
            metadata = {}
            for _ in range(n_kv):
                key = cur.string()
                try:
                    metadata[key] = cur.value(cur.scalar("I"), max_array)
                except ValueError as exc:
                    raise ValueError(f"metadata field {key!r}: {exc}") from None
            tensors = [_tensor(cur) for _ in range(n_tensors)]
        except struct.error as exc:
            raise ValueError(f"truncated header: {exc}") from None
        header = GGUFHeader(version, metadata, tensors)
    align = header.alignment
    return GGUFHeader(version, metadata, tensors, data_start=-(-cur.pos // align) * align)


def _tensor(cur: _Cursor) -> TensorInfo:
    name = cur.string()
    dims = tuple(cur.scalar("Q") for _ in range(cur.scalar("I")))
    ggml_type = cur.scalar("I")
    return TensorInfo(name, dims, ggml_type, cur.scalar("Q"))


def check_layout(header: GGUFHeader, file_size: int) -> None:
    """ValueError unless every tensor's data is in the file, aligned, with a known type and whole blocks."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # the block sizes of ggml's types

    for tensor in header.tensors:
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.ggml_type)]
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
