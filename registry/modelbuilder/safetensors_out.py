"""Streaming writer for the safetensors format.

``safetensors.numpy.save_file`` needs every tensor in memory at once (twice,
as arrays and as bytes), and numpy has no bfloat16. This writer lays the file
out exactly as the reference implementation does (tensors ordered by name,
compact JSON header padded with spaces to 8 bytes) but produces tensor data
one tensor at a time, so a 0.5 B-parameter checkpoint never sits in memory.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .weights import TensorSpec

DTYPES = {"f32": ("F32", 4), "f16": ("F16", 2), "bf16": ("BF16", 2)}
_CHUNK = 1 << 22  # elements converted per write, bounds temporaries for big tensors


def to_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> the stored representation (bf16 as uint16, round-to-nearest-even)."""
    if dtype == "f32":
        return np.ascontiguousarray(values, dtype=np.float32)
    if dtype == "f16":
        return values.astype(np.float16)
    if dtype == "bf16":
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
        return (rounded >> np.uint32(16)).astype(np.uint16)
    raise ValueError(f"unsupported safetensors dtype {dtype!r}")


def _header(specs: list[TensorSpec], dtype: str, metadata: dict[str, str]) -> bytes:
    st_dtype, itemsize = DTYPES[dtype]
    entries: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for ts in specs:
        size = ts.numel * itemsize
        entries[ts.name] = {"dtype": st_dtype, "shape": list(ts.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    return raw + b" " * (-len(raw) % 8)


def write_safetensors(
    fout: BinaryIO,
    specs: list[TensorSpec],
    produce: Callable[[TensorSpec], np.ndarray],
    dtype: str,
    metadata: dict[str, str] | None = None,
) -> None:
    """Write ``specs`` (values from ``produce``, float32) stored as ``dtype``."""
    ordered = sorted(specs, key=lambda ts: ts.name)
    header = _header(ordered, dtype, metadata or {"format": "pt"})
    fout.write(struct.pack("<Q", len(header)))
    fout.write(header)
    for ts in ordered:
        values = produce(ts)
        if values.shape != ts.shape:
            raise ValueError(f"{ts.name}: produced shape {values.shape}, expected {ts.shape}")
        flat = values.reshape(-1)
        for start in range(0, flat.size, _CHUNK):
            data = to_dtype(flat[start : start + _CHUNK], dtype)
            fout.write(data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes())


def save(path: Path, specs: list[TensorSpec], produce: Callable[[TensorSpec], np.ndarray], dtype: str) -> None:
    with open(path, "wb") as fout:
        write_safetensors(fout, specs, produce, dtype)
