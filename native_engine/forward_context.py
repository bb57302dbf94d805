"""Attention metadata for one forward pass, built by the model runner and passed down the model.

A batch is laid out decode rows first (one query token each), then prefill chunks. The context is
an argument of `model(input_ids, positions, ctx)`, never module or process state, so two model
runners in one process (one engine thread per model) cannot see each other's batches. CUDA graphs
capture the decode path with a context whose tensors are the graph's static buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .lora.punica import LoRAMapping


@dataclass(slots=True)
class PrefillChunk:
    query_start: int  # first row of this chunk in the flattened batch
    query_len: int  # tokens computed this step
    context_len: int  # tokens in the cache after this step (cached prefix + chunk)
    block_table: torch.Tensor  # [num_blocks] int32


@dataclass(slots=True)
class Context:
    num_decode_tokens: int = 0
    slot_mapping: torch.Tensor | None = None  # [num_tokens] cache slot per token, -1 = skip
    block_tables: torch.Tensor | None = None  # [num_decodes, max_blocks] int32, -1 padded
    context_lens: torch.Tensor | None = None  # [num_decodes] int32
    prefills: list[PrefillChunk] = field(default_factory=list)
    sample_indices: torch.Tensor | None = None  # rows whose logits are needed
    logits: torch.Tensor | None = None  # [num_tokens, V], set by a forward that computed the LM head itself
    verify_offsets: torch.Tensor | None = None  # [num_decode_tokens] int32: each query's index in its verify
    # row (speculative decoding: a query reads keys written in this step); None when there is none
    # a mixed step through the unified attention kernel (CUDA; kernels/unified_attention.py), else None:
    query_start: torch.Tensor | None = None  # [rows + 1] each row's first token, then the token count
    seq_lens: torch.Tensor | None = None  # [rows] keys each row's sequence has after this step
    row_tables: torch.Tensor | None = None  # [rows, max_blocks] int32, -1 padded: every row's block table
    max_query_len: int = 0
    lora: LoRAMapping | None = None  # the step's rows per adapter (lora/punica.py); None: no row has one, and
    # the whole-model paths (the C decode step, the fused kernels, CUDA graphs) may run

    @property
    def prefill_from(self) -> int | None:
        """The step's first prefill row (the rows before it are decode rows); None without prefill chunks."""
        return self.num_decode_tokens if self.prefills else None
