"""The LoRA matmuls of one step (Punica's SGMV, as a segmented matmul in torch).

`LoRAMapping` lists the step's token rows as runs of one adapter slot; the model runner orders the batch
so that the rows of one adapter are adjacent (`model_runner.decode_first`): a run per adapter among the
decode rows and one among the prefill chunks. Every LoRA layer of a model reads the same `PunicaWrapper`
(the runner's own, set before a forward and cleared after), so `Linear.forward` keeps its signature.

A `LoRALayer` holds one linear's resident adapters, stacked over slots (vLLM's `lora_a_stacked`): per slot
A [s·r, in] (the A of each shard it targets) and B [out, s·r] (block diagonal over the packed shards,
alpha / r folded in; kept transposed), zero-padded to `max_lora_rank` x the shards, so a run costs two matmuls whatever
the packing: `out[run] += (x[run] · Aᵀ) · Bᵀ` (`kernels/sgmv.py`: the torch loop on CPU, two Triton
launches for all runs on CUDA).

On the CPU, where the base takes the tiled int16 kernels (Q4_1 / Q8_0 tiles, 4+ rows: prefills, mixed steps), the
LoRA rows are not a second pass: `Linear.tiled_lora_forward` hands the tiled matmul `c_fields` and the step's row
slots (`LoRAMapping.row_slots`), and `tiled_matmul_lora` (kernels/cpu_batch.c) computes every row's shrink first
(8 rows of one slot at a time vectorized over the rank, from A transposed once per call), then adds each row block's
expand to 4 output tiles right after computing them, while they are in L1 (the decode step, `llama_decode_batch`,
fuses the same shrink and expand per op). `apply` (the torch loop) serves the rest: 1-3 rows, dense weights, no C
kernels (INFER_NO_CPU_KERNELS, the x86-64 baseline build), and is the reference the fused path is tested against.

The stacks are stored in `storage_dtype`: float16 for a float32 model on the CPU (llama.cpp keeps an adapter in its
file's type, convert_lora_to_gguf.py writes f16), since a decode step that touches 8 rank-16 adapters reads them
all from memory: in float32, twice the bytes of SmolLM2-135M's tiled Q4_1 decoder weights. Every path (the C step, the torch
loop, the merged-model reference of the tests) computes with the same rounded values widened to float32; an
adapter file already in float16 loses nothing (with alpha / r a power of two), a float32 one is rounded once
(tests/native_engine/engine/test_lora_rounding.py measures it). The C kernels read Bᵀ from `tiles`, a tile-major
copy (per 16 outputs the rows of the block reaching them, contiguous), not from the [slots, R, out] stack whose
rows a tile would read 32 bytes of each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..kernels._triton import use_triton
from ..kernels.sgmv import batches, sgmv_torch, sgmv_triton


@dataclass(slots=True)
class LoRAMapping:
    segments: list[tuple[int, int, int]] = field(default_factory=list)  # (first row, end row, slot)
    _on_device: torch.Tensor | None = None  # [3, S] int32 (first row, rows, slot): the SGMV kernels' form
    batches: list[tuple[int, int, int, int]] = field(default_factory=list)  # the CPU's batched runs (sgmv.py)
    _row_slots: torch.Tensor | None = None  # [T] int32: each row's slot, -1 for none (the C kernels' form)

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
        return cls(segments, batches=batches(segments)) if segments else None

    def on_device(self, device: torch.device) -> torch.Tensor:
        """The segments for the kernels, copied to the device once per step."""
        if self._on_device is None:
            rows = [[s for s, _, _ in self.segments], [e - s for s, e, _ in self.segments],
                    [slot for _, _, slot in self.segments]]
            self._on_device = torch.tensor(rows, dtype=torch.int32).to(device, non_blocking=True)
        return self._on_device

    def row_slots(self, num_rows: int) -> torch.Tensor:
        """Each of the step's `num_rows` rows' slot (-1: none), int32 on the CPU, built once per step."""
        if self._row_slots is None or self._row_slots.shape[0] != num_rows:
            slots = torch.full((num_rows,), -1, dtype=torch.int32)
            for start, end, slot in self.segments:
                slots[start:end] = slot
            self._row_slots = slots
        return self._row_slots

    @property
    def max_len(self) -> int:
        return max(e - s for s, e, _ in self.segments)


FLOAT16_MAX = 65504.0


def storage_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The stacks' type for a model computing in `dtype` on `device` (see the module's docstring)."""
    return torch.float16 if device.type == "cpu" and dtype == torch.float32 else dtype


@dataclass(slots=True)
class PunicaWrapper:
    mapping: LoRAMapping | None = None


class LoRALayer:
    def __init__(self, punica: PunicaWrapper, shards: dict[object, tuple[int, int | None]], max_loras: int,
                 max_rank: int) -> None:
        self.punica = punica
        self.shards = shards  # shard id -> (first output row, rows or None: the whole output)
        self.max_loras, self.rank_cap = max_loras, max_rank * len(shards)
        self.a: torch.Tensor | None = None  # [max_loras, rank_cap, in], allocated with the first adapter
        self.bt: torch.Tensor | None = None  # [max_loras, rank_cap, out]: B transposed
        self.ranks = [0] * max_loras  # columns of each slot in use (its rank x the shards it targets)
        # per slot, its shards' blocks of Bᵀ: (first column, end column, first output, end output); the rest is zeros
        self.blocks: list[list[tuple[int, int, int, int]]] = [[] for _ in range(max_loras)]
        # on the CPU in float16, Bᵀ again for the C step: per 16 outputs the rank rows of the block reaching them,
        # each slot's packed at its own rank ([out / 16, rank, 16] at the start of the slot's [out / 16, max_rank,
        # 16]), so the expand reads a slot's tiles as one dense stream (None: not served there)
        self.tiles: torch.Tensor | None = None
        self.ranks_on_device: torch.Tensor | None = None
        self.blocks_on_device: torch.Tensor | None = None  # `blocks` as [max_loras, shards, 4] int32, unused: 0
        # the C kernels' view of the stacks (cpu_batch.c's `lora_t`): a, tiles, ranks, R, blocks, blocks per slot,
        # the tiles' rank as 7 int64, or None (no adapter loaded, or not float16 on the CPU with tiles)
        self.c_fields: torch.Tensor | None = None
        self.fused_rows = 0  # rows whose base matmul and LoRA ran as one C call (`Linear.tiled_lora_forward`)

    def set_slot(self, slot: int, pairs: dict[object, tuple[torch.Tensor, torch.Tensor]], scale: float,
                 out_features: int, dtype: torch.dtype, device: torch.device) -> None:
        """Slot `slot` gets these shards' (A [r, in], B [rows, r]); no pairs empties it."""
        self.ranks[slot], self.blocks[slot] = 0, []
        if self.a is not None:  # columns past the new rank must be zeros (a batch computes the widest rank)
            self.a[slot].zero_()
            self.bt[slot].zero_()
        if pairs:
            a, b = _stack(pairs, self.shards, scale, out_features)
            if a.shape[0] > self.rank_cap:
                raise ValueError(f"rank {a.shape[0] // len(pairs)} is more than max_lora_rank "
                                 f"{self.rank_cap // len(self.shards)}")
            if self.a is None:
                self.a = torch.zeros(self.max_loras, self.rank_cap, a.shape[1], dtype=dtype, device=device)
                self.bt = torch.zeros(self.max_loras, self.rank_cap, b.shape[0], dtype=dtype, device=device)
                self.tiles = _new_tiles(self.max_loras, self.rank_cap // len(self.shards), self.shards, b.shape[0],
                                        dtype, device)
            self.a[slot, : a.shape[0]] = a
            self.bt[slot, : a.shape[0]] = b.T
            self.ranks[slot] = a.shape[0]
            self.blocks[slot] = _blocks(pairs, self.shards, out_features)
        if self.tiles is not None:
            self._tile(slot)
        if self.a is not None:
            self.ranks_on_device = torch.tensor(self.ranks, dtype=torch.int32).to(self.a.device)
            table = torch.zeros(self.max_loras, len(self.shards), 4, dtype=torch.int32)
            for i, blocks in enumerate(self.blocks):
                if blocks:
                    table[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            self.blocks_on_device = table.to(self.a.device)
            self.c_fields = self._c_fields()

    def _c_fields(self) -> torch.Tensor | None:
        if self.tiles is None or not (self.a.dtype == torch.float16 and self.a.device.type == "cpu"
                                      and self.a.is_contiguous()):
            return None
        blocks = self.blocks_on_device
        return torch.tensor([self.a.data_ptr(), self.tiles.data_ptr(), self.ranks_on_device.data_ptr(),
                             self.a.shape[1], blocks.data_ptr(), blocks.shape[1], self.tiles.shape[2]],
                            dtype=torch.int64)

    def c_rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(`c_fields`, the step's row slots) for the C kernels to add the adapters' rows of x [T, in] (float32 on
        the CPU), or None: no adapter row in the step, or stacks the C kernels do not take."""
        mapping = self.punica.mapping
        if mapping is None or self.c_fields is None or x.dtype != torch.float32 or x.device.type != "cpu":
            return None
        return self.c_fields, mapping.row_slots(x.shape[0])

    def _tile(self, slot: int) -> None:
        flat = self.tiles[slot].view(-1)  # packed at the slot's rank: tile n16's rows at n16 * rank * 16
        flat.zero_()
        for c0, c1, o0, o1 in self.blocks[slot]:
            rank, block = c1 - c0, self.bt[slot, c0:c1, o0:o1].view(c1 - c0, (o1 - o0) // 16, 16)
            flat[o0 * rank : o1 * rank] = block.transpose(0, 1).reshape(-1)

    def apply(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:  # x: [T, in], out: [T, out]
        mapping = self.punica.mapping
        if mapping is None or self.a is None:
            return out
        if use_triton(x):
            return sgmv_triton(x, out, self.a, self.bt, self.ranks_on_device, mapping.on_device(x.device),
                               mapping.max_len)
        return sgmv_torch(x, out, self.a, self.bt, self.ranks, mapping.batches, self.blocks)


def _new_tiles(max_loras: int, max_rank: int, shards: dict, out_features: int, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor | None:
    """The C step's tiles of Bᵀ (see `LoRALayer.tiles`): float16 on the CPU, when every shard starts and ends on
    a multiple of 16 outputs."""
    edges = [edge for offset, rows in shards.values() for edge in (offset, offset + (rows or out_features))]
    if dtype != torch.float16 or device.type != "cpu" or any(edge % 16 for edge in edges):
        return None
    return torch.zeros(max_loras, out_features // 16, max_rank, 16, dtype=dtype)


def _blocks(pairs: dict, shards: dict, out_features: int) -> list[tuple[int, int, int, int]]:
    """The non-zero blocks of `_stack`'s B, as (first column, end column, first output, end output) of Bᵀ."""
    rank = next(iter(pairs.values()))[0].shape[0]
    out = []
    for j, shard in enumerate(pairs):
        offset, rows = shards[shard]
        out.append((j * rank, (j + 1) * rank, offset, offset + (rows or out_features)))
    return out


def _stack(pairs: dict, shards: dict, scale: float, out_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The shards' A stacked [s·r, in], and B [out, s·r] block diagonal with the scale folded in (float32)."""
    rank = next(iter(pairs.values()))[0].shape[0]
    b = torch.zeros(out_features, rank * len(pairs), dtype=torch.float32)
    for j, (shard, (_, shard_b)) in enumerate(pairs.items()):
        offset, rows = shards[shard]
        assert shard_b.shape[0] == (rows or out_features), f"shard {shard!r}: B has {shard_b.shape[0]} rows"
        b[offset : offset + shard_b.shape[0], j * rank : (j + 1) * rank] = shard_b * scale
    return torch.cat([shard_a for shard_a, _ in pairs.values()]), b
