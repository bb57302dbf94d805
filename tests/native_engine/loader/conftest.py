"""Test models for the loader tests, built once per session (tiny, seconds in all)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from registry.modelbuilder import PRESETS, ModelSpec, build_gguf, build_hf, gguf_out

# hidden/intermediate multiples of 256 so llama.cpp's K-quants apply to every matrix.
QUANT_SPEC = ModelSpec(
    name="tiny-quant",
    hidden_size=256,
    intermediate_size=512,
    num_heads=4,
    num_kv_heads=2,
    num_layers=1,
    vocab_size=1024,
)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("loader-models")


@pytest.fixture(scope="session")
def build(models_dir: Path) -> Callable[..., Path]:
    """build(preset_or_spec, fmt="gguf"|"hf", dtype="f32", pre=None) -> path, cached per argument set."""
    cache: dict[tuple[Any, ...], Path] = {}

    def _build(spec: str | ModelSpec, fmt: str = "gguf", dtype: str = "f32", pre: str | None = None) -> Path:
        spec = PRESETS[spec] if isinstance(spec, str) else spec
        key = (spec, fmt, dtype, pre)
        if key not in cache:
            cache[key] = _make(models_dir, spec, fmt, dtype, pre, len(cache))
        return cache[key]

    return _build


def _make(root: Path, spec: ModelSpec, fmt: str, dtype: str, pre: str | None, n: int) -> Path:
    out = root / f"{spec.name}-{n}-{dtype}{'.gguf' if fmt == 'gguf' else ''}"
    if fmt == "hf":
        return build_hf(out, spec, dtype=dtype)
    with pytest.MonkeyPatch.context() as mp:
        if pre is not None:
            mp.setattr(gguf_out, "TOKENIZER_PRE", pre)
        return build_gguf(out, spec, dtype=dtype)


def rewrite_gguf(
    src: Path,
    dst: Path,
    *,
    set_fields: dict[str, tuple[Any, ...]] | None = None,
    extra_tensors: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType | None]] | None = None,
    drop_fields: tuple[str, ...] = (),
) -> Path:
    """Copy a GGUF file with metadata fields replaced/added/dropped and tensors added.

    set_fields: key -> (value, GGUFValueType[, array item type]).
    extra_tensors: name -> (float array, None) or (uint8 block bytes, quant type).
    """
    reader, set_fields = gguf.GGUFReader(src), set_fields or {}
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_fields or key in set_fields:
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub)
    for key, value in set_fields.items():
        writer.add_key_value(key, *value)
    for t in reader.tensors:
        data = np.array(t.data)
        writer.add_tensor(t.name, data, raw_dtype=t.tensor_type if data.dtype == np.uint8 else None)
    for name, (values, qtype) in (extra_tensors or {}).items():
        writer.add_tensor(name, values, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
