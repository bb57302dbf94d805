"""Decode steps replayed from CUDA graphs, one per batch-size bucket (1, 2, 4, 8, then every 16).

Inputs are copied into static buffers; padded rows get slot -1 and context length 0, so they
write nothing and read nothing. The LM head stays outside the graph (nano-vllm's layout).
"""

from __future__ import annotations

import torch
from torch import nn

from .forward_context import Context


def batch_buckets(max_bs: int) -> list[int]:
    buckets = [b for b in (1, 2, 4, 8) if b <= max_bs] + list(range(16, max_bs + 1, 16))
    return buckets if buckets[-1] == max_bs else buckets + [max_bs]


class DecodeGraphs:
    def __init__(self, model: nn.Module, max_bs: int, max_blocks: int, hidden_size: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.max_bs, self.max_blocks = model, max_bs, max_blocks
        self.buckets = batch_buckets(max_bs)
        new = lambda *shape, dtype, fill=0: torch.full(shape, fill, dtype=dtype, device=device)  # noqa: E731
        self.input_ids = new(max_bs, dtype=torch.long)
        self.positions = new(max_bs, dtype=torch.long)
        self.slot_mapping = new(max_bs, dtype=torch.long, fill=-1)
        self.context_lens = new(max_bs, dtype=torch.int32)
        self.block_tables = new(max_bs, max_blocks, dtype=torch.int32, fill=-1)
        self.outputs = torch.zeros(max_bs, hidden_size, device=device, dtype=dtype)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._capture_all()

    def _context(self, bs: int) -> Context:
        return Context(num_decode_tokens=bs, slot_mapping=self.slot_mapping[:bs],
                       block_tables=self.block_tables[:bs], context_lens=self.context_lens[:bs])

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        for bs in reversed(self.buckets):  # largest first; the others reuse its memory pool
            graph = torch.cuda.CUDAGraph()
            ctx = self._context(bs)
            self.outputs[:bs] = self.model(self.input_ids[:bs], self.positions[:bs], ctx)  # warm-up
            with torch.cuda.graph(graph, pool):
                self.outputs[:bs] = self.model(self.input_ids[:bs], self.positions[:bs], ctx)
            pool = pool or graph.pool()
            self.graphs[bs] = graph
            torch.cuda.synchronize()

    def can_run(self, ctx: Context, num_tokens: int) -> bool:
        return (not ctx.prefills and num_tokens == ctx.num_decode_tokens and 0 < num_tokens <= self.max_bs
                and ctx.block_tables.shape[1] <= self.max_blocks)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        n = input_ids.shape[0]
        bs = next(b for b in self.buckets if b >= n)
        self.input_ids[:n], self.positions[:n] = input_ids, positions
        self.slot_mapping.fill_(-1)
        self.slot_mapping[:n] = ctx.slot_mapping
        self.context_lens.zero_()
        self.context_lens[:n] = ctx.context_lens
        self.block_tables.fill_(-1)
        self.block_tables[:n, : ctx.block_tables.shape[1]] = ctx.block_tables
        self.graphs[bs].replay()
        return self.outputs[:n]
