"""The QKV projection's epilogue in one kernel: bias, rotary embedding of q and k, and the KV-cache write.

`qkv` [T, (nh + 2 nkv) * D] is the projection without its bias. In place, per token: q += bq and k += bk are
rotated (NEOX halves or GPT-J pairs, in float32 like `rotary_embedding`), v += bv; then k and v go to their
cache slot (slot -1: not written). Three launches (bias, `rotary_embedding`, `reshape_and_cache`) become one,
which counts at batch 1 where a decode layer is a string of tiny kernels. The torch reference is that sequence
of the existing ops; the dispatcher runs Triton on CUDA tensors and the reference elsewhere.
"""

import torch

from native_engine.kernels._triton import assert_last_dim_contiguous, tl, triton, use_triton
from native_engine.kernels.reshape_and_cache import reshape_and_cache
from native_engine.kernels.rotary_embedding import rotary_embedding


@triton.jit
def _heads(x_ptr, b_ptr, num_heads, head_dim, half, cos, sin,
           ROTATE: tl.constexpr, HAS_BIAS: tl.constexpr, IS_NEOX: tl.constexpr,
           BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Bias (and rotation) of `num_heads` heads at x_ptr, stored back; returns the two halves as stored."""
    heads = tl.arange(0, BLOCK_H)[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < num_heads) & (offs < half)
    if IS_NEOX:
        i1 = heads * head_dim + offs
        i2 = i1 + half
    else:
        i1 = heads * head_dim + 2 * offs
        i2 = i1 + 1
    x1 = tl.load(x_ptr + i1, mask=mask, other=0.0)
    x2 = tl.load(x_ptr + i2, mask=mask, other=0.0)
    if HAS_BIAS:  # rounded to the activations' dtype first, as F.linear's output would be
        x1 = (x1.to(tl.float32) + tl.load(b_ptr + i1, mask=mask, other=0.0).to(tl.float32)).to(x_ptr.dtype.element_ty)
        x2 = (x2.to(tl.float32) + tl.load(b_ptr + i2, mask=mask, other=0.0).to(tl.float32)).to(x_ptr.dtype.element_ty)
    if ROTATE:
        a, b = x1.to(tl.float32), x2.to(tl.float32)
        x1 = (a * cos - b * sin).to(x_ptr.dtype.element_ty)
        x2 = (b * cos + a * sin).to(x_ptr.dtype.element_ty)
        tl.store(x_ptr + i1, x1, mask=mask)
        tl.store(x_ptr + i2, x2, mask=mask)
    elif HAS_BIAS:
        tl.store(x_ptr + i1, x1, mask=mask)
        tl.store(x_ptr + i2, x2, mask=mask)
    return x1, x2, i1, i2, mask


@triton.jit
def _qkv_rope_cache_kernel(
    qkv_ptr, bias_ptr, positions_ptr, cos_sin_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    qkv_stride, cos_sin_stride, cache_stride_b, cache_stride_s, cache_stride_h, block_size,
    num_heads, num_kv_heads, head_dim,
    HAS_BIAS: tl.constexpr, IS_NEOX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_KV: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    half = head_dim // 2
    pos = tl.load(positions_ptr + token)
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    row = cos_sin_ptr + pos * cos_sin_stride
    cos = tl.load(row + offs, mask=offs < half, other=0.0).to(tl.float32)
    sin = tl.load(row + half + offs, mask=offs < half, other=0.0).to(tl.float32)
    q_ptr = qkv_ptr + token * qkv_stride
    k_ptr = q_ptr + num_heads * head_dim
    v_ptr = k_ptr + num_kv_heads * head_dim
    kb_ptr = bias_ptr + num_heads * head_dim
    vb_ptr = kb_ptr + num_kv_heads * head_dim
    _heads(q_ptr, bias_ptr, num_heads, head_dim, half, cos, sin, True, HAS_BIAS, IS_NEOX, BLOCK_H, BLOCK_HALF)
    k1, k2, i1, i2, mask = _heads(k_ptr, kb_ptr, num_kv_heads, head_dim, half, cos, sin, True, HAS_BIAS, IS_NEOX,
                                  BLOCK_KV, BLOCK_HALF)
    v1, v2, _, _, _ = _heads(v_ptr, vb_ptr, num_kv_heads, head_dim, half, cos, sin, False, HAS_BIAS, IS_NEOX,
                             BLOCK_KV, BLOCK_HALF)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:
        # the cache row of this token: [nkv, D] at (block, offset); i1/i2 index heads * head_dim + dims
        base = (slot // block_size) * cache_stride_b + (slot % block_size) * cache_stride_s
        heads = tl.arange(0, BLOCK_KV)[:, None]
        c1 = base + heads * cache_stride_h + (i1 - heads * head_dim)
        c2 = base + heads * cache_stride_h + (i2 - heads * head_dim)
        tl.store(k_cache_ptr + c1, k1, mask=mask)
        tl.store(k_cache_ptr + c2, k2, mask=mask)
        tl.store(v_cache_ptr + c1, v1, mask=mask)
        tl.store(v_cache_ptr + c2, v2, mask=mask)


def _split(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int):
    return qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)


def _check(qkv, bias, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads,
           head_dim) -> None:
    assert slot_mapping is not None and k_cache.numel(), "the kernel writes the cache: slots and a cache needed"
    assert qkv.dim() == 2 and qkv.shape[1] == (num_heads + 2 * num_kv_heads) * head_dim, (qkv.shape, num_heads)
    assert qkv.dtype in (torch.float32, torch.float16, torch.bfloat16) and head_dim % 2 == 0, (qkv.dtype, head_dim)
    assert bias is None or (bias.shape == (qkv.shape[1],) and bias.is_contiguous()), "bias: [(nh + 2 nkv) * D]"
    assert positions.shape == (qkv.shape[0],) and positions.is_contiguous()
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == head_dim
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride() and k_cache.dim() == 4
    assert k_cache.shape[2:] == (num_kv_heads, head_dim) and k_cache.dtype == qkv.dtype, (k_cache.shape, k_cache.dtype)
    assert slot_mapping.shape == (qkv.shape[0],) and slot_mapping.is_contiguous()
    assert_last_dim_contiguous(qkv, cos_sin_cache, k_cache, v_cache)


def qkv_rope_cache_triton(qkv: torch.Tensor, bias: torch.Tensor | None, positions: torch.Tensor,
                          cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          slot_mapping: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                          is_neox: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(qkv, bias, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads, head_dim)
    if qkv.shape[0]:
        _qkv_rope_cache_kernel[(qkv.shape[0],)](
            qkv, qkv if bias is None else bias, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
            qkv.stride(0), cos_sin_cache.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            k_cache.shape[1], num_heads, num_kv_heads, head_dim,
            HAS_BIAS=bias is not None, IS_NEOX=is_neox, BLOCK_H=triton.next_power_of_2(num_heads),
            BLOCK_KV=triton.next_power_of_2(num_kv_heads), BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        )
    return _split(qkv, num_heads, num_kv_heads, head_dim)


def qkv_rope_cache_ref(qkv: torch.Tensor, bias: torch.Tensor | None, positions: torch.Tensor,
                       cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       slot_mapping: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                       is_neox: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The unfused sequence: bias, `rotary_embedding`, `reshape_and_cache` (each dispatching as usual)."""
    if bias is not None:
        qkv.add_(bias)
    q, k, v = _split(qkv, num_heads, num_kv_heads, head_dim)
    rotary_embedding(positions, q, k, head_dim, cos_sin_cache, is_neox)
    if k_cache.numel() and slot_mapping is not None:
        reshape_and_cache(k.view(-1, num_kv_heads, head_dim), v.view(-1, num_kv_heads, head_dim), k_cache, v_cache,
                          slot_mapping)
    return q, k, v


def qkv_rope_cache(qkv: torch.Tensor, bias: torch.Tensor | None, positions: torch.Tensor,
                   cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor | None, num_heads: int, num_kv_heads: int, head_dim: int,
                   is_neox: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [T, (nh + 2 nkv) * D] without bias -> (q, k, v) views of it, biased and rotated in place; k and v
    written to the cache at slot_mapping [T] (-1: skipped; None or an empty cache: nothing written)."""
    writes = slot_mapping is not None and k_cache.numel() > 0
    fn = qkv_rope_cache_triton if use_triton(qkv) and writes else qkv_rope_cache_ref
    return fn(qkv, bias, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads,
              head_dim, is_neox)
