"""One entry point per checkpoint kind: a Hugging Face directory or a .gguf file."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from gguf_io.gguf_file import GGUFFile
from .gguf_loader import load_gguf
from .hf_loader import load_hf
from .lazy import lazy_gguf, lazy_hf
from .model_config import ModelConfig
from gguf_io.tokenizer import Tokenizer

Weights = Iterator[tuple[str, torch.Tensor]]


def load_model(path: str | os.PathLike[str], dtype: torch.dtype = torch.float32) -> tuple[ModelConfig, Weights]:
    """``load_hf`` for a checkpoint directory, ``load_gguf`` for a .gguf file."""
    return load_hf(path, dtype) if Path(path).is_dir() else load_gguf(path, dtype)


def load_checkpoint(
    path: str | os.PathLike[str], dtype: torch.dtype | Callable[[ModelConfig], torch.dtype] = torch.float32,
    keep_q4_1: bool = False, load_format: str = "auto", lazy: bool = False,
) -> tuple[ModelConfig, Weights | None, Tokenizer]:
    """Config, lazy weights and tokenizer; a GGUF file's metadata is parsed once for all three.

    ``dtype`` may be a function of the config (to follow the checkpoint's own dtype); ``keep_q4_1``:
    see ``load_gguf``; ``load_format="dummy"``: no weights (None), the directory needs only config.json
    and the tokenizer's files; ``lazy``: each weight a handle that reads only the slice a tensor-parallel
    rank asks for (``lazy.py``)."""
    if Path(path).is_dir():
        config = ModelConfig.from_hf(path)
        if load_format == "dummy":
            return config, None, Tokenizer.from_hf(path)
        load = lazy_hf if lazy else load_hf
        return *load(path, dtype(config) if callable(dtype) else dtype), Tokenizer.from_hf(path)
    reader = GGUFFile(path)
    if callable(dtype):
        dtype = dtype(ModelConfig.from_gguf(reader))
    config, weights = (lazy_gguf if lazy else load_gguf)(reader, dtype, keep_q4_1)
    return config, None if load_format == "dummy" else weights, Tokenizer.from_gguf(reader)
