"""Weight-only int4 matmuls on CPU for weights that came from 4-bit GGUF blocks.

A Q4_1 block is 32 weights `w = d * q + m` with `q` in 0..15, and llama.cpp's quantizer always
uses both ends of the range (the block's min is `q = 0`, its max `q = 15`). So the dequantized
float32 matrix gives the blocks back exactly: per group of 32, `m = min`, `d = (max - min) / 15`.
`pack_int4` does that and keeps the result only when it reproduces the matrix (otherwise the
layer stays dense: no quantization error is ever added here).

The packed weights feed PyTorch's CPU kernel `aten._weight_int4pack_mm_for_cpu` (as gpt-fast and
torchao use it), whose fast path takes bfloat16 activations, scales and zeros, and computes
`w = (q - 8) * scale + zero`: 0.5 byte per weight read instead of 4. Rounding the zeros to bf16
is the costly error (each multiplies the plain sum of its group's 32 activations), so their f32
remainders are added back with a small `[T, groups] @ [groups, out]` matmul of group sums. On
SmolLM2 this keeps the mean KL to the f32 path at 7e-4 (max 5e-3, llama.cpp's: 2e-2) for one
kernel call per linear; bf16 heads and tails of activations and scales as well (a second call)
only reach 5e-4. The residual stream, norms, attention and KV cache stay float32.

When the system has a C compiler, weights that arrive as Q4_1 / Q8_0 blocks skip all of that:
`BlockWeight` keeps the blocks and multiplies them with float32 activations in registers
(`kernels/cpu_kernels.c`), which is cheaper per call (no casts, no zero tail) and far more accurate
(activations as int16 per group of 32 or float32, no bf16 anywhere). For batches of 4+ rows the same
blocks are also kept repacked in tiles of 16 rows (`kernels/cpu_batch.py`, AVX512-VNNI or AVX2). The int4
path stays as the fallback without a compiler.

The tied LM head of SmolLM-style files is Q8_0 (int8 blocks `w = d * q8`); `pack_int8_as_int4`
splits each `q8 + 128 = 16 * h + l` into two nibbles, so two int4 matmuls give `d * q8` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import cpu_batch, cpu_kernels

GROUP_SIZE = 32
_EXACT_RTOL = 1e-5  # reconstruction error allowed, relative to the group's scale


@dataclass(slots=True)
class Int4Weight:
    """One [out, in] matrix as packed nibbles plus bf16 (scale, zero) per group of `group_size`."""

    packed: torch.Tensor  # [out, in / 2] uint8, the kernel's layout
    scales_zeros: torch.Tensor  # [in / group_size, out, 2] bfloat16
    zero_tail: torch.Tensor  # [in / group_size, out] float32: each zero minus its bf16 rounding
    group_size: int = GROUP_SIZE

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, in] float32 -> [T, out] float32
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, self.group_size,
                                                         self.scales_zeros)
        group_sums = x.view(x.shape[0], -1, self.group_size).sum(-1)  # [T, in / group_size]
        return out.float().addmm_(group_sums, self.zero_tail)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales_zeros.numel() * 2 + self.zero_tail.numel() * 4


@dataclass(slots=True)
class BlockWeight:
    """One [out, in] matrix as GGUF blocks: packed Q4_1 nibbles with (d, m), or Q8_0 values with d."""

    qs: torch.Tensor  # Q4_1: [out, in / 2] uint8; Q8_0: [out, in] int8
    d: torch.Tensor  # [out, in / 32] float32
    m: torch.Tensor | None = None  # [out, in / 32] float32; None for Q8_0
    tiled: cpu_batch.TiledBlocks | None = None  # the same blocks for batches of 4+ rows (`kernels/cpu_batch.py`)

    @classmethod
    def q4_1(cls, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, tiles: bool = True) -> BlockWeight:
        return cls.with_tiles(cpu_kernels.pack_q4_1(q), d.contiguous(), m.contiguous(), tiles)

    @classmethod
    def q8_0(cls, q8: torch.Tensor, d: torch.Tensor, tiles: bool = True) -> BlockWeight:
        return cls.with_tiles(q8.contiguous(), d.contiguous(), None, tiles)

    @classmethod
    def with_tiles(cls, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, tiles: bool = True) -> BlockWeight:
        """The blocks, also tiled for batches when `tiles` (the tiled kernel passed its check on this CPU)."""
        return cls(qs, d, m, cpu_batch.TiledBlocks.build(qs, d, m) if tiles else None)

    def unpacked(self) -> torch.Tensor:
        """The block values [N, K]: Q4_1 nibbles 0..15 (uint8) or the Q8_0 int8 values."""
        if self.m is None:
            return self.qs
        packed = self.qs.view(self.qs.shape[0], -1, 16)
        return torch.cat([packed & 15, packed >> 4], dim=-1).view(self.qs.shape[0], -1)

    def tiled_for(self, x: torch.Tensor) -> cpu_batch.TiledBlocks | None:
        """The tiles when they take x [T, in] (4+ rows), else None (the 1-3 row kernel does)."""
        return self.tiled if self.tiled is not None and x.shape[0] >= cpu_batch.MIN_ROWS else None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, in] float32 -> [T, out] float32
        if (tiled := self.tiled_for(x)) is not None:
            return tiled.matmul(x)
        return cpu_kernels.blocks_matmul(x, self.qs, self.d, self.m)

    @property
    def nbytes(self) -> int:
        tiled = self.tiled.nbytes if self.tiled is not None else 0
        return tiled + sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m) if t is not None)


def use_block_kernels(out_features: int) -> bool:
    """The C kernels serve this matrix (they take rows in fours) and a compiler was found."""
    return out_features % 4 == 0 and cpu_kernels.library() is not None


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q: [out, in] integers in 0..15 -> the packed weight of `aten._weight_int4pack_mm_for_cpu`.

    Always through PyTorch's own packing op: its layout is private and differs between the kernels it
    picks at run time (the AVX-512, AVX2 and scalar kernels read different ones), so only the op knows
    the one the matmul of this process will read. `kernel_check` proves the pair on this CPU at load."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)


def from_blocks(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> Int4Weight:
    """Q4_1 blocks (w = d * q + m per group of 32; q: [out, in] uint8, d, m: [out, in / 32] float32)."""
    return _pack(q, d, m + 8 * d)


def from_q8_blocks(q8: torch.Tensor, d: torch.Tensor) -> tuple[Int4Weight, Int4Weight]:
    """Q8_0 blocks (w = d * q8; q8: [out, in] int8, d: [out, in / 32]) as high and low nibble matrices."""
    u = q8.view(torch.uint8) ^ 0x80  # q8 + 128 as an unsigned byte
    high = _pack(u >> 4, 16 * d, torch.zeros_like(d))  # (h - 8) * 16d
    low = _pack(u & 15, d, 8 * d)  # (l - 8) * d + 8d; the two sum to d * (16h + l - 128)
    return high, low


def _pack(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> Int4Weight:
    # q: [out, in] in 0..15; scale, zero: [out, groups] float32 for w = (q - 8) * scale + zero
    packed = pack_nibbles(q)
    scales_zeros = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
    zero_tail = (zero.t() - scales_zeros[..., 1].float()).contiguous()
    return Int4Weight(packed, scales_zeros, zero_tail)


def can_pack(weight: torch.Tensor) -> bool:
    return (weight.dim() == 2 and weight.shape[1] % (2 * GROUP_SIZE) == 0 and weight.shape[0] % 16 == 0
            and weight.dtype == torch.float32)  # the kernel's packing needs rows in multiples of 16


def pack_int4(weight: torch.Tensor) -> Int4Weight | None:
    """Q4_1-style groups recovered from a float32 matrix, or None when it is not one."""
    if not can_pack(weight):
        return None
    if weight.shape[0] > 64 and pack_int4(weight[:64]) is None:  # most matrices fail on their first rows
        return None
    out_features, in_features = weight.shape
    groups = weight.view(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    low, high = groups.amin(-1), groups.amax(-1)
    d = (high - low) / 15
    safe_d = torch.where(d == 0, torch.ones_like(d), d)
    q = ((groups - low[..., None]) / safe_d[..., None]).round().clamp(0, 15)
    error = (q * d[..., None] + low[..., None] - groups).abs().amax(-1)
    if bool((error > _EXACT_RTOL * safe_d.abs() + 1e-12).any()):
        return None
    return _pack(q.view(out_features, in_features).to(torch.int32), d, low + 8 * d)


def pack_int8_as_int4(weight: torch.Tensor) -> tuple[Int4Weight, Int4Weight] | None:
    """Q8_0-style groups (w = d * q8, |q8| <= 127, max |q8| = 127) as a high and a low nibble matrix."""
    if not can_pack(weight):
        return None
    if weight.shape[0] > 64 and pack_int8_as_int4(weight[:64]) is None:
        return None
    out_features, in_features = weight.shape
    groups = weight.view(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    d = groups.abs().amax(-1) / 127
    safe_d = torch.where(d == 0, torch.ones_like(d), d)
    q8 = (groups / safe_d[..., None]).round().clamp(-128, 127)
    if bool(((q8 * d[..., None] - groups).abs().amax(-1) > _EXACT_RTOL * safe_d + 1e-12).any()):
        return None
    return from_q8_blocks(q8.to(torch.int8).view(out_features, in_features), d)
