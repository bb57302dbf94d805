"""Decode steps replayed from CUDA graphs, one per batch-size bucket (1, 2, 4, 8, then every 16).

The graphs read their inputs from static buffers: `inputs` [4, max_bs] int64 (input ids, positions,
slot mapping, context lengths), which `InputBuffers.prepare` fills with one host-to-device copy,
padded to the bucket (slot -1 and context length 0: padded rows write and read nothing), and
`block_tables` [max_bs, max_blocks] int32, into which `run` copies the step's tables on the device.
The LM head stays outside the graph (nano-vllm's layout): it runs on the sampled rows only.

With `unified_attention`, steps that hold prefill chunks have graphs too (`MixedGraphs`, one per token bucket).
"""

from __future__ import annotations

import torch
from torch import nn

from .forward_context import Context


@torch.inference_mode()
def capture(buckets: list[int], forward) -> dict[int, torch.cuda.CUDAGraph]:
    """One graph per bucket of `forward(bucket)` (which writes into static buffers), each after a warm-up run;
    the largest first, the others reusing its memory pool."""
    graphs, pool = {}, None
    for n in reversed(buckets):
        graph = torch.cuda.CUDAGraph()
        forward(n)  # warm-up
        with torch.cuda.graph(graph, pool):
            forward(n)
        pool = pool or graph.pool()
        graphs[n] = graph
        torch.cuda.synchronize()
    return graphs


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

    def _forward(self, bs: int) -> None:
        self.outputs[:bs] = self.model(self.inputs[0, :bs], self.inputs[1, :bs], self._context(bs))

    def _capture_all(self) -> None:
        self.graphs = capture(self.buckets, self._forward)

    def bucket(self, num_rows: int, width: int) -> int | None:
        """The graph that serves a decode-only step of num_rows rows and tables of width blocks, if any."""
        if not 0 < num_rows <= self.max_bs or width > self.max_blocks:
            return None
        return next(b for b in self.buckets if b >= num_rows)

    def run(self, bs: int, ctx: Context) -> torch.Tensor:
        """Replay bucket bs; `self.inputs` already holds the step's inputs (see `InputBuffers.prepare`)."""
        n, width = ctx.block_tables.shape
        self.block_tables[:n, :width].copy_(ctx.block_tables)
        self._replay(bs)
        self.num_replays += 1
        return self.outputs[:n]

    def _replay(self, bs: int) -> None:
        self.graphs[bs].replay()


def token_buckets(max_tokens: int) -> list[int]:
    """Token counts a mixed step is padded to: powers of two from 64, then the step budget itself."""
    buckets = [t for t in (64, 128, 256, 512, 1024, 2048, 4096, 8192) if t < max_tokens]
    return buckets + [max_tokens]


class MixedGraphs:
    """Steps with prefill chunks replayed from CUDA graphs, one per token bucket (`token_buckets`): the attention
    of such a step is the unified kernel (kernels/unified_attention.py), whose launch depends only on the token
    count and the row count, so the whole forward can be captured (vLLM v1's full graphs for mixed batches).

    The graph's static buffers: `tokens` [3, max_tokens] int64 (input ids, positions, slot mapping), `rows`
    [2 * max_rows + 1] int64 (query start offsets, then key counts) and `tables` [max_rows, max_blocks] int32.
    `run` copies the step's eager inputs into them on the device, padding both ways: tokens past the step's
    write no KV (slot -1) and belong to no row, rows past the step's are empty (they start at the step's
    token count and have no keys), so the kernel's programs for them return at once."""

    def __init__(self, model: nn.Module, max_tokens: int, max_rows: int, max_blocks: int, hidden_size: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.max_rows, self.max_blocks = model, max_rows, max_blocks
        self.buckets = token_buckets(max_tokens)
        self.tokens = torch.zeros(3, max_tokens, dtype=torch.long, device=device)
        self.rows = torch.zeros(2 * max_rows + 1, dtype=torch.long, device=device)
        self.tables = torch.zeros(max_rows, max_blocks, dtype=torch.int32, device=device)
        self.outputs = torch.zeros(max_tokens, hidden_size, device=device, dtype=dtype)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.num_replays = 0
        self._capture_all()

    def _context(self, num_tokens: int) -> Context:
        r = self.max_rows
        return Context(slot_mapping=self.tokens[2, :num_tokens], query_start=self.rows[: r + 1],
                       seq_lens=self.rows[r + 1 :], row_tables=self.tables, max_query_len=2)  # the chunks' variant

    def _forward(self, num_tokens: int) -> None:
        self.outputs[:num_tokens] = self.model(self.tokens[0, :num_tokens], self.tokens[1, :num_tokens],
                                               self._context(num_tokens))

    def _capture_all(self) -> None:
        self.tokens[2].fill_(-1)  # while capturing, every row is empty and no token writes KV
        self.graphs = capture(self.buckets, self._forward)

    def bucket(self, num_tokens: int, num_rows: int, width: int) -> int | None:
        """The graph that serves a mixed step of this many tokens, rows and table blocks, if any."""
        if num_tokens > self.buckets[-1] or num_rows > self.max_rows or width > self.max_blocks:
            return None
        return next(b for b in self.buckets if b >= num_tokens)

    def load(self, bucket: int, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Context) -> None:
        """The step's inputs (eager layout, on the device) into the static buffers, padded to `bucket`."""
        n, (rows, width), r = len(input_ids), ctx.row_tables.shape, self.max_rows
        self.tokens[0, :n].copy_(input_ids)
        self.tokens[1, :n].copy_(positions)
        self.tokens[2, :n].copy_(ctx.slot_mapping)
        self.tokens[2, n:bucket].fill_(-1)
        self.rows[: rows + 1].copy_(ctx.query_start)
        self.rows[rows + 1 : r + 1].fill_(n)
        self.rows[r + 1 : r + 1 + rows].copy_(ctx.seq_lens)
        self.rows[r + 1 + rows :].zero_()
        self.tables[:rows, :width].copy_(ctx.row_tables)

    def run(self, bucket: int, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        self.load(bucket, input_ids, positions, ctx)
        self._replay(bucket)
        self.num_replays += 1
        return self.outputs[: len(input_ids)]

    def _replay(self, bucket: int) -> None:
        self.graphs[bucket].replay()
