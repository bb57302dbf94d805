"""Decode steps replayed from CUDA graphs, one per batch-size bucket (1, 2, 4, 8, then every 16).

The graphs read their inputs from static buffers: `inputs` [4, max_bs] int64 (input ids, positions,
slot mapping, context lengths), which `InputBuffers.prepare` fills with one host-to-device copy,
padded to the bucket (slot -1 and context length 0: padded rows write and read nothing), and
`block_tables` [max_bs, max_blocks] int32, into which `run` copies the step's tables on the device.
The LM head stays outside the graph (nano-vllm's layout): it runs on the sampled rows only.
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
        self.inputs = torch.zeros(4, max_bs, dtype=torch.long, device=device)
        self.inputs[2].fill_(-1)
        self.block_tables = torch.full((max_bs, max_blocks), -1, dtype=torch.int32, device=device)
        self.outputs = torch.zeros(max_bs, hidden_size, device=device, dtype=dtype)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.num_replays = 0
        self._capture_all()

    def _context(self, bs: int) -> Context:
        return Context(num_decode_tokens=bs, slot_mapping=self.inputs[2, :bs], block_tables=self.block_tables[:bs],
                       context_lens=self.inputs[3, :bs])

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        for bs in reversed(self.buckets):  # largest first; the others reuse its memory pool
            graph = torch.cuda.CUDAGraph()
            ctx = self._context(bs)
            ids, positions = self.inputs[0, :bs], self.inputs[1, :bs]
            self.outputs[:bs] = self.model(ids, positions, ctx)  # warm-up
            with torch.cuda.graph(graph, pool):
                self.outputs[:bs] = self.model(ids, positions, ctx)
            pool = pool or graph.pool()
            self.graphs[bs] = graph
            torch.cuda.synchronize()

    def bucket(self, num_rows: int, width: int) -> int | None:
        """The graph that serves a decode-only step of num_rows rows and tables of width blocks, if any."""
        if not 0 < num_rows <= self.max_bs or width > self.max_blocks:
            return None
        return next(b for b in self.buckets if b >= num_rows)

    def run(self, bs: int, ctx: Context) -> torch.Tensor:
        """Replay bucket bs; `self.inputs` already holds the step's inputs (see `InputBuffers.prepare`)."""
        n, width = ctx.block_tables.shape
        self.block_tables[:n, :width].copy_(ctx.block_tables)
        self.graphs[bs].replay()
        self.num_replays += 1
        return self.outputs[:n]
