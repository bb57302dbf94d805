"""Copies checkpoint tensors (Hugging Face names) into a built model, packed shards included."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..layers.linear import default_weight_loader


def _target(name: str, packed: dict[str, tuple[str, object]]) -> tuple[str, object]:
    for source, (packed_name, shard_id) in packed.items():
        if f".{source}." in name:
            return name.replace(f".{source}.", f".{packed_name}."), shard_id
    return name, None


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Fill every parameter of `model`; raises if one is missing or a checkpoint tensor is unknown."""
    params = dict(model.named_parameters(remove_duplicate=False))
    packed = getattr(model, "packed_modules_mapping", {})
    tied = getattr(model.config, "tie_word_embeddings", False)
    loaded: set[str] = set()
    for name, tensor in weights:
        if tied and name == "lm_head.weight":
            continue
        target, shard_id = _target(name, packed)
        if target not in params:
            raise ValueError(f"checkpoint tensor {name!r} has no place in {type(model).__name__}")
        param = params[target]
        loader = getattr(param, "weight_loader", None)
        if loader is None:
            default_weight_loader(param, tensor)
        else:
            loader(param, tensor, shard_id)
        loaded.add(target)
    missing = sorted(set(params) - loaded - ({"lm_head.weight"} if tied else set()))
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:3]}")


@torch.no_grad()
def dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """vLLM's `--load-format dummy`: every parameter drawn where it lives (on the GPU, no host copy), with
    the registry builder's scales so activations stay near unit size: norms 1, embeddings and biases
    N(0, 0.02), matrices N(0, 1 / in_features)."""
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif param.dim() == 2 and "embed" not in name and "lm_head" not in name:
            param.normal_(0.0, param.shape[1] ** -0.5, generator=generator)
        else:
            param.normal_(0.0, 0.02, generator=generator)
