"""A step's model inputs, written in place into buffers allocated once (pinned on CUDA) and sent to the
device with non-blocking copies; on CPU the model reads the host buffers themselves.

A step is first a `StepPlan` (numpy: token ids, row starts, lengths and drafts, block tables), then tensors
(`build`); a tensor-parallel group broadcasts the plan, so every rank builds the same tensors from it.

Two layouts:
- eager steps: int64 [input_ids n | positions n | slot_mapping n | context_lens d | sample_indices s
  | query_start rows + 1 | seq_lens rows], then the block tables int32 [rows, width] (decodes first, then
  the prefill chunks): two copies a step. The last two parts are there when the step's attention runs as one
  kernel over all its rows (`unified`: CUDA, a step with prefill chunks and no verify rows).
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
class StepPlan:
    """One step's numbers before they become tensors: what rank 0 of a tensor-parallel group broadcasts
    (`to_array` / `from_array`), so that every rank builds the same inputs from it."""

    ids: np.ndarray  # [n] int64: the tokens computed this step, row after row
    starts: np.ndarray  # [rows] int64: each row's first position
    counts: np.ndarray  # [rows] int64: tokens each row computes (decode and verify rows first)
    specs: np.ndarray  # [rows] int64: draft tokens a verify row checks (0: not a verify row)
    sampled: np.ndarray  # [rows] bool: the row samples (its last token's logits are needed; a verify row's all)
    table_lens: np.ndarray  # [rows] int64: blocks in each row's table
    tables: np.ndarray  # [rows, width] int32, -1 padded
    graph_bs: int | None = None  # the CUDA graph bucket that runs this step, if any

    _HEADER = 4  # rows, width, n, graph_bs (-1: eager)

    def to_array(self) -> np.ndarray:
        rows, width = self.tables.shape
        header = [rows, width, len(self.ids), -1 if self.graph_bs is None else self.graph_bs]
        return np.concatenate([np.array(header, np.int64), self.ids, self.starts, self.counts, self.specs,
                               self.sampled.astype(np.int64), self.table_lens, self.tables.reshape(-1)])

    @classmethod
    def from_array(cls, flat: np.ndarray) -> StepPlan:
        rows, width, n, graph_bs = (int(v) for v in flat[: cls._HEADER])
        parts = np.split(flat[cls._HEADER :], np.cumsum([n, rows, rows, rows, rows, rows]))
        ids, starts, counts, specs, sampled, table_lens, tables = parts
        return cls(ids, starts, counts, specs, sampled.astype(bool), table_lens,
                   tables.astype(np.int32).reshape(rows, width), None if graph_bs < 0 else graph_bs)


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
                 device: torch.device, max_spec_tokens: int = 0, unified: bool = False) -> None:
        self.device, self.block_size = device, block_size
        self.max_tokens, self.max_rows, self.max_blocks = max_num_tokens, max_num_seqs, max_blocks
        self.unified = unified  # mixed steps' attention in one kernel (EngineConfig.unified_attention)
        query_rows = max_num_seqs * (1 + max_spec_tokens)  # decode queries: a verify row has 1 + k
        size = 3 * max_num_tokens + query_rows + max_num_tokens + 2 * max_num_seqs + 1
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
        return self.build(self.plan(ordered, graph_bs), graph_inputs)

    def plan(self, ordered: list, graph_bs: int | None = None) -> StepPlan:
        """The step's numbers from the scheduled rows (the block tables straight into this step's host buffer)."""
        rows = len(ordered)
        assert rows <= self.max_rows, f"{rows} rows, buffers sized for {self.max_rows}"
        self._next_set()
        starts = np.empty(rows, np.int64)
        counts = np.empty(rows, np.int64)
        specs = np.empty(rows, np.int64)
        table_lens = np.empty(rows, np.int64)
        ids: list[int] = []
        tables = self._tables(rows, max(len(s.seq.block_table) for s in ordered))
        for r, s in enumerate(ordered):
            seq = s.seq
            start, table = seq.num_computed_tokens, seq.block_table
            starts[r], counts[r], specs[r], table_lens[r] = start, s.num_new_tokens, s.num_spec_tokens, len(table)
            ids += s.token_ids() if s.num_spec_tokens else seq.token_ids[start : start + s.num_new_tokens]
            tables[r, : len(table)] = table
        sampled = np.array([s.should_sample for s in ordered], dtype=bool)
        return StepPlan(np.array(ids, np.int64), starts, counts, specs, sampled, table_lens, tables, graph_bs)

    def _tables(self, rows: int, width: int) -> np.ndarray:
        assert width <= self.max_blocks, f"a block table of {width} blocks, buffers sized for {self.max_blocks}"
        tables = self.host_tables[: rows * width].numpy().reshape(rows, width)
        tables.fill(-1)
        return tables

    def build(self, plan: StepPlan, graph_inputs: torch.Tensor | None = None) -> StepInputs:
        """The step's tensors from its plan (made here by `plan`, or received by a tensor-parallel rank)."""
        rows, width = plan.tables.shape
        tables = self.host_tables[: rows * width].numpy().reshape(rows, width)
        if not np.shares_memory(tables, plan.tables):
            tables[:] = plan.tables
        starts, counts, specs = plan.starts, plan.counts, plan.specs
        num_decodes = int(np.count_nonzero(counts - specs == 1)) if plan.graph_bs is None else rows
        token_rows = np.repeat(np.arange(rows), counts)
        offsets = np.cumsum(counts) - counts  # first token of each row in the flat batch
        positions = np.repeat(starts - offsets, counts) + np.arange(len(plan.ids))
        slots = tables[token_rows, positions // self.block_size].astype(np.int64) * self.block_size \
            + positions % self.block_size
        num_queries = int(counts[:num_decodes].sum())  # decode query rows: 1 per decode, 1 + k per verify
        num_tables = rows
        if num_queries > num_decodes:  # verify rows: one table per query token
            tables = np.concatenate([tables[token_rows[:num_queries]], tables[num_decodes:]])
            num_tables = len(tables)
            self.host_tables[: tables.size].numpy()[:] = tables.reshape(-1)
        dev_tables = self._send(self.host_tables, self.dev_tables, num_tables * width).view(num_tables, width)
        if plan.graph_bs is not None:
            return self._graph_inputs(plan.ids, positions, slots, positions + 1, dev_tables, plan.graph_bs,
                                      graph_inputs, counts)
        return self._eager_inputs(plan, positions, slots, offsets, (num_decodes, num_queries), dev_tables)

    def _eager_inputs(self, plan: StepPlan, positions, slots, offsets, decodes: tuple[int, int], dev_tables
                      ) -> StepInputs:
        ids, starts, counts, specs = plan.ids, plan.starts, plan.counts, plan.specs
        num_decodes, nq = decodes
        n, host = len(ids), self.host.numpy()
        sampled = plan.sampled.astype(np.int64) * (specs + 1)  # sampled positions per row
        first = np.repeat(offsets + counts - sampled, sampled)
        sample_rows = first + np.arange(len(first)) - np.repeat(np.cumsum(sampled) - sampled, sampled)
        s, rows = len(sample_rows), len(counts)
        host[:n], host[n : 2 * n], host[2 * n : 3 * n] = ids, positions, slots
        host[3 * n : 3 * n + nq] = positions[:nq] + 1
        host[3 * n + nq : 3 * n + nq + s] = sample_rows
        ends, tail = starts + counts, 3 * n + nq + s
        unified = self.unified and rows > num_decodes and nq == num_decodes
        if unified:  # the unified kernel's rows: their offsets in the batch, then their key counts
            host[tail : tail + 2 * rows + 1] = np.concatenate([offsets, [n], ends])
        dev = self._send(self.host, self.dev, tail + (2 * rows + 1 if unified else 0))
        ctx = Context(num_decode_tokens=nq, slot_mapping=dev[2 * n : 3 * n])
        if unified:
            ctx.query_start, ctx.seq_lens = dev[tail : tail + rows + 1], dev[tail + rows + 1 : tail + 2 * rows + 1]
            ctx.row_tables, ctx.max_query_len = dev_tables[:rows], int(counts.max())
        if nq > num_decodes:
            ctx.verify_offsets = self._verify_offsets(counts[:num_decodes], nq)
        if nq:
            ctx.block_tables, ctx.context_lens = dev_tables[:nq], dev[3 * n : 3 * n + nq]
        chunks = () if unified else range(num_decodes, rows)  # the per-chunk path's chunks
        for r in chunks:
            chunk_table = dev_tables[nq + r - num_decodes, : int(plan.table_lens[r])]
            ctx.prefills.append(PrefillChunk(int(offsets[r]), int(counts[r]), int(ends[r]), chunk_table))
        if s < n:  # else every token is sampled: the LM head takes all rows
            ctx.sample_indices = dev[3 * n + nq : 3 * n + nq + s]
        return StepInputs(dev[:n], dev[n : 2 * n], ctx, len(counts))

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
