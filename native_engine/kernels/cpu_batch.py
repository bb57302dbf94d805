"""Batched matmuls (4+ activation rows) over GGUF Q4_1 / Q8_0 blocks repacked in tiles of 16 output rows.

`cpu_batch.c` (built into the same library as `cpu_kernels.c`) multiplies int16 activations (per row
and group of 32, error <= 1.5e-5 of the group's largest |x|) with the integer weights through
AVX512-VNNI (32 multiply-adds for 16 outputs per instruction) or AVX2 (two vpmaddwd for the same), and
scales each group once per 16
outputs: about twice the float32 rate of dequantizing in registers, and no BLAS detour for prefill
chunks. `TiledBlocks.build` repacks once at load (same bytes as the blocks); it is None when the CPU
or compiler has neither tier (cpu_step.h: a plain-C build), or the row count is not a multiple of 16, and callers keep the
float32 kernels of `cpu_kernels.py`.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from . import cpu_kernels

TILE = 16  # output rows side by side in one tile
MIN_ROWS = 4  # from this many activation rows on the tiled kernel is used (fewer: the 1-3 row kernel)
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


def library() -> ctypes.CDLL | None:
    """The compiled kernels when they include the tiled matmul (the AVX-512 or AVX2 tier), else None."""
    lib = cpu_kernels.library()
    return lib if lib is not None and _declare(lib) else None


@functools.cache
def _declare(lib: ctypes.CDLL) -> bool:
    lib.tiled_available.restype = lib.attention_batch_serves.restype = lib.decode_batch_serves.restype = _INT
    if not lib.tiled_available():
        return False
    lib.tile_blocks.argtypes = (_P, _P, _P, _I64, _I64, _P, _P, _P)
    lib.tiled_matmul.argtypes = (_P, _I64, _I64, _P, _P, _P, _I64, _P, _INT)
    lib.tiled_matmul_lora.argtypes = (_P, _I64, _I64, _P, _P, _P, _I64, _P, _P, _P, _INT)
    lib.attention_batch_serves.argtypes = (_I64, _I64, _I64)
    lib.decode_batch_serves.argtypes = (_I64,) * 6
    lib.paged_attention_batch.argtypes = (_P, _P, _P, _P, _P, ctypes.c_float, *(_I64,) * 6, _P, _INT)
    lib.llama_decode_batch.argtypes = (_I64, _I64, _P, _P, _P, _P, _P, *(_I64,) * 6, ctypes.c_float, _P, _I64, _P,
                                       _P, ctypes.c_float, _P, _P, _INT)
    lib.silu_mul_rows.argtypes = (_P, _I64, _I64, _P, _INT)
    for fn in (lib.tile_blocks, lib.tiled_matmul, lib.tiled_matmul_lora, lib.paged_attention_batch,
               lib.llama_decode_batch, lib.silu_mul_rows):
        fn.restype = None
    return True


def paged_attention_batch(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """The decode attention of `llama_decode_batch`: query [B, nh, D]; caches [num_blocks, block_size, nkv, D];
    int32 tables [B, W] and lengths [B]. Needs `serves_attention(nh, nkv, D)`."""
    assert serves_attention(query.shape[1], k_cache.shape[2], query.shape[2])
    return cpu_kernels.paged_attention_call(library().paged_attention_batch, query, k_cache, v_cache, block_tables,
                                            context_lens, scale)


def serves_silu_and_mul(x: torch.Tensor) -> bool:
    """`silu_and_mul` takes x: 4+ float32 CPU rows of 2 * I columns, I a multiple of 16, and the tiled build."""
    return (x.dim() == 2 and x.shape[0] >= MIN_ROWS and x.shape[1] % 32 == 0 and x.dtype == torch.float32
            and x.device.type == "cpu" and library() is not None)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # x [T, 2 * I] -> [T, I]: 16 lanes at a time, rows over threads
    x = x.contiguous()
    out = x.new_empty(x.shape[0], x.shape[1] // 2)
    library().silu_mul_rows(x.data_ptr(), x.shape[0], out.shape[1], out.data_ptr(), torch.get_num_threads())
    return out


def serves_decode_batch(num_rows: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
                        intermediate: int) -> bool:
    """Whether `llama_decode_batch` takes a decode step of `num_rows` rows of this model shape."""
    lib = library()
    return lib is not None and bool(lib.decode_batch_serves(num_rows, hidden, num_heads, num_kv_heads, head_dim,
                                                            intermediate))


def serves_attention(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    lib = library()
    return lib is not None and bool(lib.attention_batch_serves(num_heads, num_kv_heads, head_dim))


@dataclass(slots=True)
class TiledBlocks:
    """An [N, K] block matrix in tiles of 16 rows: qt bytes, dt (and mt for Q4_1) [N / 16, K / 32, 16] float32."""

    qt: torch.Tensor
    dt: torch.Tensor
    mt: torch.Tensor | None
    shape: tuple[int, int]

    @classmethod
    def build(cls, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> TiledBlocks | None:
        """From Q4_1 (qs [N, K / 2] uint8, m given) or Q8_0 (qs [N, K] int8, m None) blocks; None if not served."""
        lib = library()
        n, k = d.shape[0], d.shape[1] * 32
        if lib is None or n % TILE:
            return None
        qt, dt = torch.empty(qs.numel(), dtype=torch.uint8), torch.empty_like(d)
        mt = None if m is None else torch.empty_like(m)
        lib.tile_blocks(qs.data_ptr(), d.data_ptr(), None if m is None else m.data_ptr(), n, k, qt.data_ptr(),
                        dt.data_ptr(), None if mt is None else mt.data_ptr())
        return cls(qt, dt, mt, (n, k))

    def matmul(self, x: torch.Tensor, lora: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x [T, K] float32 -> [T, N] float32. `lora`: (a linear's adapters as `LoRALayer.c_fields`, each row's
        slot [T] int32, -1: none): each row's adapter added in the same call (`tiled_matmul_lora`: the shrink of
        every row, then each tile's expand while its outputs are in cache; lora/punica.py)."""
        x = x.contiguous()
        n, k = self.shape
        out = torch.empty(x.shape[0], n, dtype=torch.float32)
        if not x.shape[0]:
            return out
        args = (x.data_ptr(), x.shape[0], k, self.qt.data_ptr(), self.dt.data_ptr(),
                None if self.mt is None else self.mt.data_ptr(), n, out.data_ptr())
        if lora is None:
            library().tiled_matmul(*args, torch.get_num_threads())
        else:
            fields, slots = lora
            assert slots.dtype == torch.int32 and slots.shape == (x.shape[0],) and fields.shape == (7,)
            library().tiled_matmul_lora(*args, fields.data_ptr(), slots.data_ptr(), torch.get_num_threads())
        return out

    @property
    def pointers(self) -> list[int]:
        return [self.qt.data_ptr(), self.dt.data_ptr(), 0 if self.mt is None else self.mt.data_ptr()]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qt, self.dt, self.mt) if t is not None)
