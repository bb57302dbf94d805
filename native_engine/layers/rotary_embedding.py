"""Rotary position embedding (rotate-half / NEOX layout, as Hugging Face Llama and Qwen2)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..kernels import rotary_embedding


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    middle = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(middle, smoothed, out)


def inverse_frequencies(head_dim: int, base: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if kind == "freq_factors":  # llama.cpp's rope_freqs.weight (Llama 3.1+ GGUFs)
        return inv_freq / torch.tensor(scaling["freq_factors"], dtype=torch.float64)
    raise ValueError(f"unsupported rope scaling type {kind!r} (supported: linear, llama3, freq_factors)")


def compute_cos_sin_cache(
    head_dim: int, max_position: int, base: float, scaling: dict | None, dtype: torch.dtype
) -> torch.Tensor:  # -> [max_position, head_dim]: cos in the first half, sin in the second
    inv_freq = inverse_frequencies(head_dim, base, scaling)
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float64), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, base: float, scaling: dict | None) -> None:
        super().__init__()
        self.head_dim = head_dim
        cache = compute_cos_sin_cache(head_dim, max_position, base, scaling, torch.float32)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:  # positions: [T]; query: [T, nh * D]; key: [T, nkv * D]
        return rotary_embedding(positions, query, key, self.head_dim, self.cos_sin_cache, True)
