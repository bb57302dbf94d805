"""A fast GGUF header reader: metadata scalars and tensor shapes without touching the weights.

``gguf.GGUFReader`` builds Python objects for every element of every array, which takes seconds on
a real vocabulary (151,936 tokens for Qwen2). Serving needs only the scalars and tensor shapes, so
this walks the header with ``struct`` over an mmap and keeps arrays only up to ``max_array``
elements (longer ones become ``[]``, as Ollama's ``model_info`` shows them).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

# GGUF value types -> struct format (scalars); 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict
    tensors: list[TensorInfo]


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
    """Parse the header; raises ``ValueError`` (bad magic, truncated file, unknown type)."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError("bad magic")
        cur = _Cursor(buf)
        cur.pos = 4
        try:
            version, n_tensors, n_kv = cur.scalar("I"), cur.scalar("Q"), cur.scalar("Q")
            metadata = {}
            for _ in range(n_kv):
                key = cur.string()
                metadata[key] = cur.value(cur.scalar("I"), max_array)
            tensors = [_tensor(cur) for _ in range(n_tensors)]
        except struct.error as exc:
            raise ValueError(f"truncated header: {exc}") from None
    return GGUFHeader(version, metadata, tensors)


def _tensor(cur: _Cursor) -> TensorInfo:
    name = cur.string()
    dims = tuple(cur.scalar("Q") for _ in range(cur.scalar("I")))
    ggml_type = cur.scalar("I")
    cur.scalar("Q")  # data offset
    return TensorInfo(name, dims, ggml_type)
