"""Token embedding and LM head; vocab-parallel in a tensor-parallel group (Megatron-LM): each rank holds
the rows of its vocabulary span. The embedding looks up the ids in its span (zeros for the others) and
sums over the group (one all-reduce); the LM head projects onto its span and the logits are gathered to
rank 0, the one that samples."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.partition import Span
from ..loader.gguf_loader import Q8Blocks
from ..loader.lazy import materialize, narrow
from .linear import Linear, default_weight_loader
from . import kernel_check
from .quant import BlockWeight, Int4Weight, from_q8_blocks, pack_int4, pack_int8_as_int4, use_block_kernels


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, rows: Span | None = None, tp=None) -> None:
        super().__init__()
        self.rows, self.tp = rows or Span(0, vocab_size), tp
        self.weight = nn.Parameter(torch.empty(self.rows.size, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.q8_blocks: Q8Blocks | None = None  # kept for a tied LM head's int4 matmuls

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        loaded = materialize(narrow(loaded, 0, self.rows.start, self.rows.size))
        if isinstance(loaded, Q8Blocks):
            self.q8_blocks = loaded
        default_weight_loader(param, loaded)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        if self.tp is None:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.rows.start
        mine = (local >= 0) & (local < self.rows.size)
        hidden = F.embedding(local.clamp(0, self.rows.size - 1), self.weight) * mine[:, None]
        return self.tp.all_reduce(hidden)


class LMHead(Linear):
    """Projects only the rows the sampler needs (the last token of each sampling sequence).

    `use_packed_weights` gives it int4 matmuls over its 4- or 8-bit GGUF blocks while the dense weight
    stays (it is usually the token embedding too)."""

    def __init__(self, vocab_size: int, hidden_size: int, rows: Span | None = None, tp=None,
                 vocab_sizes: tuple[int, ...] = ()) -> None:
        self.rows = rows or Span(0, vocab_size)
        super().__init__(hidden_size, self.rows.size, bias=False)
        self.tp, self.vocab_sizes = tp, list(vocab_sizes)  # every rank's rows, for the gather
        self.packed: tuple[Int4Weight | BlockWeight, ...] = ()

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        super().weight_loader(param, narrow(loaded, 0, self.rows.start, self.rows.size), shard_id)

    def use_packed_weights(self, q8_blocks: Q8Blocks | None = None) -> int:
        """Packed copies of the weight: its Q8_0 blocks for the C kernel, or int4 ones from them when given, else recovered from the dense
        weight when it is exactly 4- or 8-bit blocks; returns their bytes (0: stays dense)."""
        q8 = (q8_blocks.q, q8_blocks.d, None) if q8_blocks is not None else None
        if q8 is not None and use_block_kernels(q8_blocks.shape[0]) and kernel_check.usable("blocks", *q8):
            self.packed = (BlockWeight.q8_0(q8_blocks.q, q8_blocks.d, kernel_check.usable("tiled", *q8)),)
        elif q8 is not None:
            self.packed = from_q8_blocks(q8_blocks.q, q8_blocks.d) if kernel_check.usable("torch-int4", *q8) else ()
        elif (int4 := pack_int4(self.weight.data)) is not None:
            self.packed = (int4,) if kernel_check.usable("torch-int4", *kernel_check.sample_blocks("q4_1")) else ()
        elif (halves := pack_int8_as_int4(self.weight.data)) is not None:
            self.packed = halves if kernel_check.usable("torch-int4", *kernel_check.sample_blocks("q8_0")) else ()
        else:
            self.packed = ()
        return sum(p.nbytes for p in self.packed)

    def forward(self, x: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor | None:
        # x: [T, H] -> [S, V] float32, S = len(indices) (all rows when None); in a group, rank 0 gets the
        # whole vocabulary's and the other ranks None
        if indices is not None:
            x = x.index_select(0, indices)
        logits = sum(p.matmul(x) for p in self.packed) if self.packed else super().forward(x).float()
        return logits if self.tp is None else self.tp.gather_rows(logits, self.vocab_sizes)
