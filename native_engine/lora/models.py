"""An adapter read from disk: per base weight (Hugging Face name, in the engine's row order), A [r, in]
and B [out, r], and its scale alpha / r.

Two formats: a PEFT directory (`adapter_config.json`: `r`, `lora_alpha`, `use_rslora`;
`adapter_model.safetensors`: `base_model.model.<name>.lora_A.weight`) and a GGUF LoRA as llama.cpp's
`convert_lora_to_gguf.py` writes it (`adapter.lora.alpha`; `blk.N.attn_q.weight.lora_a` / `.lora_b`, B's
rows in llama.cpp's q/k order, put back as the base's are by `unpermute_qk`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from gguf_io.gguf_file import open_gguf
from gguf_io.metadata import gguf_value

from ..loader.gguf_loader import hf_name, tensor_to_torch, unpermute_qk
from ..loader.model_config import ModelConfig


@dataclass(slots=True)
class LoRAModel:
    name: str
    rank: int
    scale: float
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]  # base weight name -> (A [r, in], B [out, r])


def load_lora(name: str, path: str | Path, config: ModelConfig) -> LoRAModel:
    """The adapter at `path` for a model of `config`; ValueError when it is not one."""
    path = Path(path)
    if path.is_dir():
        rank, scale, weights = _read_peft(path)
    elif path.is_file():
        rank, scale, weights = _read_gguf(path, config)
    else:
        raise ValueError(f"LoRA adapter {name!r}: no file or directory at {path}")
    for base, (a, b) in weights.items():
        if a.shape[0] != rank or b.shape[1] != rank:
            raise ValueError(f"LoRA adapter {name!r}: {base} has rank {a.shape[0]}/{b.shape[1]}, expected {rank}")
    return LoRAModel(name, rank, scale, weights)


def _read_peft(root: Path) -> tuple[int, float, dict]:
    from safetensors.torch import load_file

    config = json.loads((root / "adapter_config.json").read_text())
    rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(root / "adapter_model.safetensors").items():
        stem, _, kind = key.removeprefix("base_model.model.").rpartition(".lora_")
        pairs.setdefault(stem + ".weight", {})[kind] = tensor.float()
    return rank, scale, {base: (p["A.weight"], p["B.weight"]) for base, p in pairs.items()}


def _read_gguf(path: Path, config: ModelConfig) -> tuple[int, float, dict]:
    reader = open_gguf(str(path))
    kind = gguf_value(reader, "general.type")
    if kind != "adapter" or gguf_value(reader, "adapter.type") != "lora":
        raise ValueError(f"{path} is not a GGUF LoRA adapter (general.type={kind!r})")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for t in reader.tensors:
        stem, _, kind = t.name.rpartition(".lora_")
        base = hf_name(stem)
        tensor = tensor_to_torch(t, torch.float32)
        pairs.setdefault(base, {})[kind] = unpermute_qk(config, base, tensor) if kind == "b" else tensor
    rank = next(iter(pairs.values()))["a"].shape[0]
    alpha = float(gguf_value(reader, "adapter.lora.alpha") or 0.0)
    return rank, alpha / rank if alpha else 1.0, {base: (p["a"], p["b"]) for base, p in pairs.items()}
