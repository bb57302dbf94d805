"""The LoRA matmuls of one step (Punica's SGMV, as a segmented matmul in torch).

`LoRAMapping` lists the step's token rows as runs of one adapter slot; the model runner orders the batch
so that the rows of one adapter are adjacent (`model_runner.decode_first`): a run per adapter among the
decode rows and one among the prefill chunks. Every LoRA layer of a model reads the same `PunicaWrapper`
(the runner's own, set before a forward and cleared after), so `Linear.forward` keeps its signature.

A `LoRALayer` holds one linear's resident adapters, per slot: A [s·r, in] (the A of each shard it targets,
stacked) and B [out, s·r] (block diagonal over the packed shards, alpha / r folded in), so a run costs two
matmuls whatever the packing: `out[run] += (x[run] · Aᵀ) · Bᵀ`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class LoRAMapping:
    segments: list[tuple[int, int, int]] = field(default_factory=list)  # (first row, end row, slot)

    @classmethod
    def build(cls, row_slots: list[tuple[int, int]]) -> LoRAMapping | None:
        """From (token count, slot or -1) per scheduled row, in batch order; None when no row has an adapter."""
        segments, start = [], 0
        for count, slot in row_slots:
            if slot >= 0 and segments and segments[-1][2] == slot and segments[-1][1] == start:
                segments[-1] = (segments[-1][0], start + count, slot)
            elif slot >= 0:
                segments.append((start, start + count, slot))
            start += count
        return cls(segments) if segments else None


@dataclass(slots=True)
class PunicaWrapper:
    mapping: LoRAMapping | None = None


class LoRALayer:
    def __init__(self, punica: PunicaWrapper, shards: dict[object, tuple[int, int | None]], max_loras: int) -> None:
        self.punica = punica
        self.shards = shards  # shard id -> (first output row, rows or None: the whole output)
        self.a: list[torch.Tensor | None] = [None] * max_loras
        self.b: list[torch.Tensor | None] = [None] * max_loras

    def set_slot(self, slot: int, pairs: dict[object, tuple[torch.Tensor, torch.Tensor]], scale: float,
                 out_features: int, dtype: torch.dtype, device: torch.device) -> None:
        """Slot `slot` gets these shards' (A [r, in], B [rows, r]); no pairs empties it."""
        if not pairs:
            self.a[slot] = self.b[slot] = None
            return
        rank = next(iter(pairs.values()))[0].shape[0]
        b = torch.zeros(out_features, rank * len(pairs), dtype=torch.float32)
        for j, (shard, (_, shard_b)) in enumerate(pairs.items()):
            offset, rows = self.shards[shard]
            assert shard_b.shape[0] == (rows or out_features), f"shard {shard!r}: B has {shard_b.shape[0]} rows"
            b[offset : offset + shard_b.shape[0], j * rank : (j + 1) * rank] = shard_b * scale
        a = torch.cat([shard_a for shard_a, _ in pairs.values()])
        self.a[slot], self.b[slot] = a.to(device, dtype).contiguous(), b.to(device, dtype).contiguous()

    def apply(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:  # x: [T, in], out: [T, out]
        mapping = self.punica.mapping
        if mapping is None:
            return out
        for start, end, slot in mapping.segments:
            a = self.a[slot]
            if a is not None:
                out[start:end].addmm_(x[start:end] @ a.T, self.b[slot].T)
        return out
