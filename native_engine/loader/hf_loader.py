"""Weights from a Hugging Face checkpoint directory (config.json + *.safetensors), one tensor at a time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from .model_config import ModelConfig

# Buffers some checkpoints carry that are recomputed by the model, not loaded.
_SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)


def safetensors_files(path: str | os.PathLike[str]) -> list[Path]:
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {os.fspath(path)!r}")
    return files


def load_hf(
    path: str | os.PathLike[str], dtype: torch.dtype = torch.float32
) -> tuple[ModelConfig, Iterator[tuple[str, torch.Tensor]]]:
    """(config, lazy iterator of (name, tensor in ``dtype``)) over every safetensors shard."""
    config = ModelConfig.from_hf(path)
    return config, _iter_tensors(safetensors_files(path), dtype)


def _iter_tensors(files: list[Path], dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        with safe_open(file, framework="pt") as shard:
            for name in shard.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if not name.endswith(_SKIPPED_SUFFIXES):
                    yield name, shard.get_tensor(name).to(dtype)
