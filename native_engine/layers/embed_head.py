from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .linear import Linear


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        return F.embedding(input_ids, self.weight)


class LMHead(Linear):
    """Projects only the rows the sampler needs (the last token of each sampling sequence)."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__(hidden_size, vocab_size, bias=False)

    def forward(self, x: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        # x: [T, H] -> [S, V] float32, S = len(indices) (all rows when None)
        if indices is not None:
            x = x.index_select(0, indices)
        return super().forward(x).float()
