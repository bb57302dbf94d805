"""A dense decoder's shape, from a Hugging Face ``config.json`` or a GGUF header (weights never read).

From GGUF the weight bytes are the tensors' real stored sizes (quantized blocks included); from a
config they are ``parameters × bytes per parameter`` of the asked dtype.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

BYTES_PER_PARAM = {"f32": 4.0, "bf16": 2.0, "f16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


@dataclass(frozen=True)
class ModelShape:
    """``h`` hidden, ``i`` intermediate, ``L`` layers, ``a`` heads, ``kv`` KV heads, ``V`` vocab (estimate.md §1)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    stored_weight_bytes: float | None = None  # measured from the file; None = parameters × dtype bytes
    stored_dtype: str | None = None

    def __post_init__(self) -> None:
        values = (self.hidden_size, self.intermediate_size, self.num_layers, self.num_heads, self.num_kv_heads,
                  self.vocab_size)
        if min(values) <= 0 or self.hidden_size % self.num_heads:
            raise ValueError(f"{self.name}: not a dense decoder shape {values}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_ratio(self) -> float:
        return self.num_kv_heads / self.num_heads

    def weight_bytes(self, dtype: str | None) -> float:
        """Bytes of weights read per decode step: the file's own size, or parameters at ``dtype``."""
        if dtype is None and self.stored_weight_bytes is not None:
            return self.stored_weight_bytes
        return parameter_count(self) * BYTES_PER_PARAM[dtype or "bf16"]

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> float:
        """``2 · L · kv · head_dim · bytes`` (estimate.md §2)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * BYTES_PER_PARAM[kv_dtype]


def parameter_count(m: ModelShape) -> float:
    h, i = m.hidden_size, m.intermediate_size
    return m.vocab_size * h + m.num_layers * (3 * h * i + 2 * h * h + 2 * h * h * m.kv_ratio)


def from_hf_config(path: Path) -> ModelShape:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    cfg = cfg.get("text_config", cfg)
    try:
        return ModelShape(name=str(cfg.get("_name_or_path") or path.parent.name), hidden_size=cfg["hidden_size"],
                          intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
                          num_heads=cfg["num_attention_heads"],
                          num_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
                          vocab_size=cfg["vocab_size"])
    except KeyError as exc:
        raise ValueError(f"{path}: config.json has no {exc.args[0]}") from None


def from_gguf(path: Path) -> ModelShape:
    import gguf

    from gguf_io.gguf_file import read_header

    try:
        header = read_header(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read GGUF {path}: {exc}") from None
    meta = header.metadata
    arch = str(meta.get("general.architecture", ""))
    tensors = {t.name: t for t in header.tensors}
    embed = tensors.get("token_embd.weight")

    def key(name: str) -> int:
        value = meta.get(f"{arch}.{name}")
        if not isinstance(value, int):
            raise ValueError(f"{path}: GGUF has no {arch}.{name}")
        return value

    stored = 0.0
    for t in header.tensors:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.ggml_type)]
        stored += math.prod(t.shape) / block * type_size
    heads = key("attention.head_count")
    return ModelShape(name=str(meta.get("general.name") or path.stem), hidden_size=key("embedding_length"),
                      intermediate_size=key("feed_forward_length"), num_layers=key("block_count"), num_heads=heads,
                      num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv") or heads),
                      vocab_size=int(embed.shape[-1]) if embed else int(meta.get(f"{arch}.vocab_size", 0)),
                      stored_weight_bytes=stored, stored_dtype=_file_type(meta))


def _file_type(meta: dict) -> str | None:
    import gguf

    try:
        return gguf.LlamaFileType(int(meta["general.file_type"])).name.removeprefix("MOSTLY_")
    except (KeyError, ValueError):
        return None


def load_shape(source: str, resolve_store_model=None) -> ModelShape:
    """A config.json (or a directory holding one), a .gguf file, or a store model name via the resolver."""
    path = Path(source)
    if path.is_dir() and (path / "config.json").exists():
        return from_hf_config(path / "config.json")
    if path.is_file():
        return from_hf_config(path) if path.suffix == ".json" else from_gguf(path)
    gguf_path = resolve_store_model(source) if resolve_store_model else None
    if gguf_path is None:
        raise ValueError(f"{source}: not a config.json, a .gguf file or a local model")
    return from_gguf(gguf_path)
