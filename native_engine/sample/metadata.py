"""What the sampler needs for one step, built by `SamplingState.metadata` (vLLM v1's `SamplingMetadata`).

A field is None when no row of the step uses it, so the sampler skips that op altogether: a batch of
greedy rows without penalties is one argmax. Tensors are on the sampling device; flags and the seeded
rows are host values, known before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class SamplingMetadata:
    num_rows: int
    slots: torch.Tensor | None  # [S] int64: each row's slot in SamplingState; None when no row needs it
    all_greedy: bool
    all_random: bool
    greedy: torch.Tensor | None = None  # [S] bool, set when greedy and random rows mix
    temperature: torch.Tensor | None = None  # [S] float32 (1 on greedy rows); None when all greedy
    top_k: torch.Tensor | None = None  # [S] int64 in 1..V (V = off); None when no random row filters by top-k
    max_top_k: int = 0  # K of the batched top-k; the vocabulary size when some random row keeps everything
    top_p: torch.Tensor | None = None  # [S] float32
    min_p: torch.Tensor | None = None  # [S] float32
    repetition_penalty: torch.Tensor | None = None  # [S] float32
    presence_penalty: torch.Tensor | None = None  # [S] float32, with frequency_penalty
    frequency_penalty: torch.Tensor | None = None  # [S] float32
    seen: torch.Tensor | None = None  # [S, V] bool: prompt and output tokens, for the repetition penalty
    output_counts: torch.Tensor | None = None  # [S, V] int32: output tokens, for presence and frequency
    generator: torch.Generator | None = None  # the engine's, for rows without a seed
    seeded: list[tuple[int, torch.Generator]] = field(default_factory=list)  # (row, its own generator)
    logprob_rows: torch.Tensor | None = None  # [L] int64: rows that asked for logprobs
    logprob_row_list: list[int] = field(default_factory=list)
    max_num_logprobs: int = 0  # top logprobs to compute for those rows
    grammar_rows: torch.Tensor | None = None  # [G] int64: rows constrained by a grammar (None with a bitmask: all)
    grammar_bitmask: torch.Tensor | None = None  # [G, ceil(V / 32)] int32, on the device
