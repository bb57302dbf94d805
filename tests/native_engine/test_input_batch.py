"""The step's input buffers: the eager layout and the CUDA-graph layout give the same ids, positions, slots,
context lengths and block tables, written in place into buffers allocated once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from native_engine.input_batch import InputBuffers, StepPlan
from native_engine.scheduler import ScheduledSequence
from native_engine.sampling_params import SamplingParams
from native_engine.sequence import Sequence


def _seq(n_tokens: int, computed: int, table: list[int]) -> Sequence:
    seq = Sequence(list(range(100, 100 + n_tokens)), SamplingParams(), block_size=4)
    seq.num_computed_tokens, seq.block_table = computed, table
    return seq


def _decodes() -> list[ScheduledSequence]:
    return [ScheduledSequence(_seq(6, 5, [3, 7]), 1), ScheduledSequence(_seq(9, 8, [1, 2, 5]), 1)]


def test_eager_layout_of_decodes_and_a_prefill_chunk():
    buffers = InputBuffers(64, 4, 8, 4, torch.device("cpu"))
    chunk = ScheduledSequence(_seq(10, 4, [9, 8, 6]), 3)  # tokens 4..6 of 10: no sample
    step = buffers.prepare([*_decodes(), chunk])
    assert step.input_ids.tolist() == [105, 108, 104, 105, 106]
    assert step.positions.tolist() == [5, 8, 4, 5, 6]
    assert step.ctx.slot_mapping.tolist() == [7 * 4 + 1, 5 * 4 + 0, 8 * 4 + 0, 8 * 4 + 1, 8 * 4 + 2]
    assert step.ctx.num_decode_tokens == 2 and step.ctx.context_lens.tolist() == [6, 9]
    assert step.ctx.block_tables.tolist() == [[3, 7, -1], [1, 2, 5]]
    (prefill,) = step.ctx.prefills
    assert (prefill.query_start, prefill.query_len, prefill.context_len) == (2, 3, 7)
    assert prefill.block_table.tolist() == [9, 8, 6]
    assert step.ctx.sample_indices.tolist() == [0, 1]  # the chunk does not reach its last token
    first = buffers.host.data_ptr()
    buffers.prepare(_decodes())
    assert buffers.host.data_ptr() == first  # the same buffers, every step


def test_graph_layout_pads_to_the_bucket_with_rows_that_touch_nothing():
    buffers = InputBuffers(64, 8, 8, 4, torch.device("cpu"))
    graph_inputs = torch.full((4, 8), 99, dtype=torch.long)
    step = buffers.prepare(_decodes(), graph_bs=4, graph_inputs=graph_inputs)
    eager = InputBuffers(64, 8, 8, 4, torch.device("cpu")).prepare(_decodes())
    assert step.graph_bs == 4 and step.input_ids.tolist() == eager.input_ids.tolist()
    assert step.positions.tolist() == eager.positions.tolist()
    assert step.ctx.slot_mapping.tolist() == eager.ctx.slot_mapping.tolist()
    assert step.ctx.context_lens.tolist() == eager.ctx.context_lens.tolist()
    assert step.ctx.block_tables.tolist() == eager.ctx.block_tables.tolist()
    assert graph_inputs[:, 2:4].tolist() == [[0, 0], [0, 0], [-1, -1], [0, 0]]  # padded rows


def _context(step) -> dict:
    ctx = step.ctx
    return {"ids": step.input_ids.tolist(), "positions": step.positions.tolist(),
            "slots": ctx.slot_mapping.tolist(), "decodes": ctx.num_decode_tokens,
            "lens": None if ctx.context_lens is None else ctx.context_lens.tolist(),
            "tables": None if ctx.block_tables is None else ctx.block_tables.tolist(),
            "prefills": [(p.query_start, p.query_len, p.context_len, p.block_table.tolist()) for p in ctx.prefills],
            "samples": None if ctx.sample_indices is None else ctx.sample_indices.tolist()}


@pytest.mark.parametrize("graph_bs", [None, 4])
def test_a_plan_sent_as_one_int64_array_builds_the_same_step_on_another_rank(graph_bs):
    """What rank 0 of a tensor-parallel group broadcasts: the other rank's own buffers build the same step."""
    rows = _decodes() if graph_bs else [*_decodes(), ScheduledSequence(_seq(10, 4, [9, 8, 6]), 3),
                                        ScheduledSequence(_seq(5, 0, [4, 0]), 5)]
    here, there = (InputBuffers(64, 8, 8, 4, torch.device("cpu")) for _ in range(2))
    plan = here.plan(rows, graph_bs)
    flat = plan.to_array()
    assert flat.dtype == np.int64 and flat.ndim == 1
    received = StepPlan.from_array(flat.copy())
    graph = [torch.zeros(4, 8, dtype=torch.long) for _ in range(2)] if graph_bs else [None, None]
    assert _context(there.build(received, graph[1])) == _context(here.build(plan, graph[0]))
