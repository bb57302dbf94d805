from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .linear import Linear
from .quant import Int4Weight, pack_int4, pack_int8_as_int4


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        return F.embedding(input_ids, self.weight)


class LMHead(Linear):
    """Projects only the rows the sampler needs (the last token of each sampling sequence).

    `use_packed_weights` gives it int4 matmuls over its 4- or 8-bit GGUF blocks while the dense weight
    stays (it is usually the token embedding too)."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__(hidden_size, vocab_size, bias=False)
        self.packed: tuple[Int4Weight, ...] = ()

    def use_packed_weights(self) -> int:
        int4 = pack_int4(self.weight.data)
        self.packed = (int4,) if int4 is not None else pack_int8_as_int4(self.weight.data) or ()
        return sum(p.nbytes for p in self.packed)

    def forward(self, x: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        # x: [T, H] -> [S, V] float32, S = len(indices) (all rows when None)
        if indices is not None:
            x = x.index_select(0, indices)
        if self.packed:
            return sum(p.matmul(x) for p in self.packed)
        return super().forward(x).float()
