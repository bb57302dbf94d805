"""Facts about a GGUF file, from its header (``gguf_io.gguf_file.read_header``); the weights are never read."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from gguf_io.gguf_file import GGUFHeader, check_layout, read_header

from .errors import ModelFormatError

GGUF_MAGIC = b"GGUF"
_MAX_ARRAY = 32  # array values longer than this are elided unless verbose


@dataclass(frozen=True)
class GGUFInfo:
    architecture: str
    parameter_count: int
    file_type: str  # "F16", "Q4_0", ... (Ollama's quantization_level)
    context_length: int | None
    embedding_length: int | None
    chat_template: str | None
    license: str | None
    metadata: dict = field(default_factory=dict, repr=False)

    @property
    def parameter_size(self) -> str:
        return human_number(self.parameter_count)


def is_gguf(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == GGUF_MAGIC


def read_gguf_info(path: Path, *, verbose: bool = False, check_data: bool = False) -> GGUFInfo:
    """The header's facts; with ``check_data``, also that every tensor's data is in the file
    (``infer create`` and ``/api/create`` check before a model is made of it)."""
    if not is_gguf(path):
        raise ModelFormatError(f"{path} is not a GGUF file (bad magic)")
    try:
        header = read_header(path, max_array=1 << 62 if verbose else _MAX_ARRAY)
        if check_data:
            check_layout(header, path.stat().st_size)
    except (ValueError, OSError) as exc:
        raise ModelFormatError(f"{path} is not a readable GGUF file: {exc}") from exc
    meta = header.metadata
    arch = str(meta.get("general.architecture", "unknown"))
    return GGUFInfo(
        architecture=arch,
        parameter_count=sum(int(math.prod(t.shape)) for t in header.tensors),
        file_type=_file_type_name(meta.get("general.file_type"), header),
        context_length=_int(meta.get(f"{arch}.context_length")),
        embedding_length=_int(meta.get(f"{arch}.embedding_length")),
        chat_template=_str(meta.get("tokenizer.chat_template")),
        license=_str(meta.get("general.license")),
        metadata=meta,
    )


def _str(value) -> str | None:
    return None if value is None else str(value)


def _int(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def _file_type_name(value, header: GGUFHeader) -> str:
    import gguf  # only for its enum names

    if value is not None:
        try:
            name = gguf.LlamaFileType(int(value)).name
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    types = {gguf.GGMLQuantizationType(t.ggml_type).name for t in header.tensors if len(t.shape) > 1}
    return types.pop() if len(types) == 1 else "unknown"


def human_number(n: int) -> str:
    """Ollama's format.HumanNumber: 494032768 -> '494.03M', 7241732096 -> '7.2B'."""
    for scale, suffix, decimals in ((1e9, "B", 1), (1e6, "M", 2)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{suffix}" if value == math.floor(value) else f"{value:.{decimals}f}{suffix}"
    return f"{n / 1e3:.0f}K" if n >= 1e3 else str(n)
