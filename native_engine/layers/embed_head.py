from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..loader.gguf_loader import Q8Blocks
from .linear import Linear, default_weight_loader
from .quant import BlockWeight, Int4Weight, from_q8_blocks, pack_int4, pack_int8_as_int4, use_block_kernels


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.q8_blocks: Q8Blocks | None = None  # kept for a tied LM head's int4 matmuls

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        if isinstance(loaded, Q8Blocks):
            self.q8_blocks = loaded
        default_weight_loader(param, loaded)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        return F.embedding(input_ids, self.weight)


class LMHead(Linear):
    """Projects only the rows the sampler needs (the last token of each sampling sequence).

    `use_packed_weights` gives it int4 matmuls over its 4- or 8-bit GGUF blocks while the dense weight
    stays (it is usually the token embedding too)."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__(hidden_size, vocab_size, bias=False)
        self.packed: tuple[Int4Weight | BlockWeight, ...] = ()

    def use_packed_weights(self, q8_blocks: Q8Blocks | None = None) -> int:
        """Packed copies of the weight: its Q8_0 blocks for the C kernel, or int4 ones from them when given, else recovered from the dense
        weight when it is exactly 4- or 8-bit blocks; returns their bytes (0: stays dense)."""
        if q8_blocks is not None and use_block_kernels(q8_blocks.shape[0]):
            self.packed = (BlockWeight.q8_0(q8_blocks.q, q8_blocks.d),)
        elif q8_blocks is not None:
            self.packed = from_q8_blocks(q8_blocks.q, q8_blocks.d)
        elif (int4 := pack_int4(self.weight.data)) is not None:
            self.packed = (int4,)
        else:
            self.packed = pack_int8_as_int4(self.weight.data) or ()
        return sum(p.nbytes for p in self.packed)

    def forward(self, x: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        # x: [T, H] -> [S, V] float32, S = len(indices) (all rows when None)
        if indices is not None:
            x = x.index_select(0, indices)
        if self.packed:
            return sum(p.matmul(x) for p in self.packed)
        return super().forward(x).float()
