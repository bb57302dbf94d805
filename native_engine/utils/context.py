"""Attention metadata for one forward pass, set by the model runner and read by `Attention`.

A batch is laid out decode rows first (one query token each), then prefill chunks.
Keeping this in one global lets the model keep the signature `model(input_ids, positions)`
and lets CUDA graphs capture the decode path with static buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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


_CONTEXT = Context()


def get_context() -> Context:
    return _CONTEXT


def set_context(context: Context) -> None:
    global _CONTEXT
    _CONTEXT = context


def reset_context() -> None:
    global _CONTEXT
    _CONTEXT = Context()
