"""A step's model inputs, written in place into buffers allocated once (pinned on CUDA) and sent to the
device with non-blocking copies; on CPU the model reads the host buffers themselves.

Two layouts:
- eager steps: int64 [input_ids n | positions n | slot_mapping n | context_lens d | sample_indices s],
  then the block tables int32 [rows, width] (decodes first, then the prefill chunks): two copies a step.
- CUDA-graph steps (decode only, n <= the graph's batch): int64 [4, max_bs] laid out as the graph's own
  static buffer, padded to the graph's bucket (slot -1, context length 0: padded rows write and read
  nothing), copied straight into it; the tables go through the eager buffer and one device copy.
The host work is numpy over the whole batch; the Python loop over rows only collects each row's numbers.

Verify rows of speculative decoding (a decode row's last token plus k drafts) count as decode rows: each
of their k + 1 tokens is a query row of the paged decode attention, with the row's block table and a
context length of its position + 1, so query j sees the KV of the drafts before it, written in the same
layer before the attention reads (the kernels write a step's KV first). Their tables are laid out one per
query token; every position of a verify row is sampled.
On CUDA the host buffers come in two sets used in turn: a step scheduled ahead fills its set while the step
before it may still be waiting for its copies, and the set it reuses belongs to the step before that, which
has been collected (its copies are done). The device buffers are single: one stream orders their uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .forward_context import Context, PrefillChunk


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    ctx: Context
    num_rows: int
    graph_bs: int | None = None  # the CUDA graph bucket that runs this step, if any


def _pinned(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.zeros(n, dtype=dtype, pin_memory=device.type == "cuda")


class InputBuffers:
    def __init__(self, max_num_tokens: int, max_num_seqs: int, max_blocks: int, block_size: int,
                 device: torch.device, max_spec_tokens: int = 0) -> None:
        self.device, self.block_size = device, block_size
        self.max_rows, self.max_blocks = max_num_seqs, max_blocks
        query_rows = max_num_seqs * (1 + max_spec_tokens)  # decode queries: a verify row has 1 + k
        size = 3 * max_num_tokens + query_rows + max_num_tokens
        on_device = device.type != "cpu"
        self._sets = [(_pinned(size, torch.int64, device), _pinned(query_rows * max_blocks, torch.int32, device),
                       _pinned(4 * query_rows, torch.int64, device)) for _ in range(2 if on_device else 1)]
        self._turn = 0
        self.host, self.host_tables, self.graph_host = self._sets[0]
        self.dev = torch.zeros_like(self.host, device=device) if on_device else self.host
        self.dev_tables = torch.zeros_like(self.host_tables, device=device) if on_device else self.host_tables

    def _next_set(self) -> None:
        """The host buffers of this step (see the module docstring); on CPU always the same ones."""
        self._turn = (self._turn + 1) % len(self._sets)
        self.host, self.host_tables, self.graph_host = self._sets[self._turn]
        if self.device.type == "cpu":
            self.dev, self.dev_tables = self.host, self.host_tables

    def _send(self, host: torch.Tensor, dev: torch.Tensor, n: int) -> torch.Tensor:
        if self.device.type == "cpu":
            return host[:n]
        dev[:n].copy_(host[:n], non_blocking=True)
        return dev[:n]

    def prepare(self, ordered: list, graph_bs: int | None = None, graph_inputs: torch.Tensor | None = None
                ) -> StepInputs:
        """`ordered`: decode and verify rows first, then prefill chunks. With `graph_bs`, a decode-only
        step whose int64 inputs go into `graph_inputs` ([4, max_bs] on the device)."""
        rows = len(ordered)
        assert rows <= self.max_rows, f"{rows} rows, buffers sized for {self.max_rows}"
        self._next_set()
        width = max(len(s.seq.block_table) for s in ordered)
        assert width <= self.max_blocks, f"a block table of {width} blocks, buffers sized for {self.max_blocks}"
        if graph_bs is not None and not any(s.num_spec_tokens for s in ordered):
            tables = self.host_tables[: rows * width].numpy().reshape(rows, width)
            tables.fill(-1)
            ids, positions, slots = self._decode_rows(ordered, tables)
            dev_tables = self._send(self.host_tables, self.dev_tables, rows * width).view(rows, width)
            lens = [p + 1 for p in positions]
            return self._graph_inputs(ids, positions, slots, lens, dev_tables, graph_bs, graph_inputs)
        starts = np.empty(rows, np.int64)
        counts = np.empty(rows, np.int64)
        specs = np.empty(rows, np.int64)
        ids: list[int] = []
        tables = np.full((rows, width), -1, np.int32)
        for r, s in enumerate(ordered):
            seq = s.seq
            starts[r], counts[r], specs[r] = seq.num_computed_tokens, s.num_new_tokens, s.num_spec_tokens
            ids += s.token_ids() if s.num_spec_tokens else seq.token_ids[starts[r] : starts[r] + counts[r]]
            tables[r, : len(seq.block_table)] = seq.block_table
        num_decodes = int(np.count_nonzero(counts - specs == 1)) if graph_bs is None else rows
        token_rows = np.repeat(np.arange(rows), counts)
        offsets = np.cumsum(counts) - counts  # first token of each row in the flat batch
        positions = np.repeat(starts - offsets, counts) + np.arange(len(ids))
        slots = tables[token_rows, positions // self.block_size].astype(np.int64) * self.block_size \
            + positions % self.block_size
        num_queries = int(counts[:num_decodes].sum())  # decode query rows: 1 per decode, 1 + k per verify
        if num_queries > num_decodes:
            tables = np.concatenate([tables[token_rows[:num_queries]], tables[num_decodes:]])
        self.host_tables[: tables.size].numpy()[:] = tables.reshape(-1)
        dev_tables = self._send(self.host_tables, self.dev_tables, tables.size).view(len(tables), width)
        if graph_bs is not None:
            return self._graph_inputs(ids, positions, slots, positions + 1, dev_tables, graph_bs, graph_inputs, counts)
        layout = (starts, counts, specs, offsets, num_decodes, num_queries)
        return self._eager_inputs(ordered, ids, positions, slots, layout, dev_tables)

    def _decode_rows(self, ordered: list, tables: np.ndarray) -> tuple[list[int], list[int], list[int]]:
        """A decode-only step (one token per row): ids, positions and cache slots, and each row's table."""
        size = self.block_size
        ids, positions, slots = [], [], []
        for r, s in enumerate(ordered):
            seq, pos = s.seq, s.seq.num_computed_tokens
            table = seq.block_table
            ids.append(seq.token_ids[pos])
            positions.append(pos)
            slots.append(table[pos // size] * size + pos % size)
            tables[r, : len(table)] = table
        return ids, positions, slots

    def _eager_inputs(self, ordered, ids, positions, slots, layout, dev_tables) -> StepInputs:
        starts, counts, specs, offsets, num_decodes, nq = layout
        n, host = len(ids), self.host.numpy()
        sampled = np.array([s.should_sample for s in ordered], dtype=np.int64) * (specs + 1)  # positions per row
        first = np.repeat(offsets + counts - sampled, sampled)
        sample_rows = first + np.arange(len(first)) - np.repeat(np.cumsum(sampled) - sampled, sampled)
        s = len(sample_rows)
        host[:n], host[n : 2 * n], host[2 * n : 3 * n] = ids, positions, slots
        host[3 * n : 3 * n + nq] = positions[:nq] + 1
        host[3 * n + nq : 3 * n + nq + s] = sample_rows
        dev = self._send(self.host, self.dev, 3 * n + nq + s)
        ctx = Context(num_decode_tokens=nq, slot_mapping=dev[2 * n : 3 * n])
        if nq > num_decodes:
            ctx.verify_offsets = self._verify_offsets(counts[:num_decodes], nq)
        if nq:
            ctx.block_tables, ctx.context_lens = dev_tables[:nq], dev[3 * n : 3 * n + nq]
        ends = starts + counts
        for r in range(num_decodes, len(ordered)):
            chunk_table = dev_tables[nq + r - num_decodes, : len(ordered[r].seq.block_table)]
            ctx.prefills.append(PrefillChunk(int(offsets[r]), int(counts[r]), int(ends[r]), chunk_table))
        if s < n:  # else every token is sampled: the LM head takes all rows
            ctx.sample_indices = dev[3 * n + nq : 3 * n + nq + s]
        return StepInputs(dev[:n], dev[n : 2 * n], ctx, len(ordered))

    def _verify_offsets(self, counts: np.ndarray, num_queries: int) -> torch.Tensor:
        """Each decode query's index within its row (0 for plain decodes). Host tensor: only the CPU
        kernels read it."""
        return torch.from_numpy((np.arange(num_queries) - np.repeat(np.cumsum(counts) - counts, counts)
                                 ).astype(np.int32))

    def _graph_inputs(self, ids, positions, slots, lens, dev_tables, bs: int, graph_inputs: torch.Tensor,
                      counts: np.ndarray | None = None) -> StepInputs:
        n, max_bs = len(ids), graph_inputs.shape[1]
        host = self.graph_host[: 4 * max_bs].numpy().reshape(4, max_bs)
        host[:, n:bs] = ((0,), (0,), (-1,), (0,))  # padded rows: no cache write, nothing read
        host[0, :n], host[1, :n], host[2, :n], host[3, :n] = ids, positions, slots, lens
        graph_inputs.copy_(self.graph_host[: 4 * max_bs].view(4, max_bs), non_blocking=True)
        ctx = Context(num_decode_tokens=n, slot_mapping=graph_inputs[2, :n], block_tables=dev_tables,
                      context_lens=graph_inputs[3, :n])
        if counts is not None and n > len(counts):  # verify rows: 1 + k queries each
            ctx.verify_offsets = self._verify_offsets(counts, n)
        return StepInputs(graph_inputs[0, :n], graph_inputs[1, :n], ctx, n, graph_bs=bs)
