"""A few-row matmul (GEMV) y = f(x) W^T (+ residual) in Triton, with the decode step's neighbours fused in.

At batch 1 a small model's decode step is bound by its kernel count, not by the bytes it reads: Qwen2-0.5B
on an H200 ran 277 kernels a step, its 896-wide projections at 1-17 % of the copy bandwidth (issue 28).
This kernel folds the work around each projection into it, so a Llama/Qwen2 layer runs as

    qkv = gemv(x, Wqkv, norm=g1)          RMSNorm in the prologue
    q, k, v = qkv_rope_cache(qkv, ...)    (kernels/qkv_rope_cache.py)
    a = attention(q, k, v)
    x = gemv(a, Wo, residual=x)           the residual add in the epilogue
    gu = gemv(x, Wgu, norm=g2)
    x = gemv(gu, Wd, silu_mul=True, residual=x)   SiLU(gate) * up in the prologue

six kernels instead of nine (add+norm, qkv, rope+cache, attention, o, add+norm, gate_up, silu_and_mul, down),
and the hidden state is the residual stream itself.

- ``norm``: every program computes the row's RMS over all of K (K <= a few thousand elements, read from L2),
  then scales each block of x by it and by the norm's weight as it goes.
- ``silu_mul``: x holds [gate | up] (2K wide); each block is SiLU(gate) * up.
- ``residual``: added to the product (both rounded to the output dtype first, as the unfused path rounds).

The prologue's values are rounded to x's dtype before the product, as the unfused kernels store them, so the
fused and unfused paths agree to the output dtype's rounding. Each program reduces BLOCK_N output columns of
one row over all of K (no split-K: the epilogue must see the whole sum). The torch reference is
:func:`fused_gemv_ref`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from native_engine.kernels._triton import assert_last_dim_contiguous, tl, triton, use_triton

MAX_ROWS = 4  # rows beyond this read W once per row: the batched GEMM path is better there


@triton.jit
def _fused_gemv_kernel(x_ptr, w_ptr, out_ptr, norm_ptr, res_ptr,
                       N, K, x_stride, w_stride, out_stride, res_stride, eps,
                       NORM: tl.constexpr, SILU_MUL: tl.constexpr, RESIDUAL: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    x_row = x_ptr + row * x_stride
    dtype = x_ptr.dtype.element_ty
    rstd = 1.0
    if NORM:
        squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            xk = tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)
            squares += xk * xk
        rstd = tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        if SILU_MUL:
            gate = tl.load(x_row + ks, mask=k_mask, other=0.0).to(tl.float32)
            up = tl.load(x_row + K + ks, mask=k_mask, other=0.0).to(tl.float32)
            xk = (gate * tl.sigmoid(gate) * up).to(dtype).to(tl.float32)
        elif NORM:
            xk = tl.load(x_row + ks, mask=k_mask, other=0.0).to(tl.float32)
            g = tl.load(norm_ptr + ks, mask=k_mask, other=0.0).to(tl.float32)
            xk = (xk * rstd * g).to(dtype).to(tl.float32)
        else:
            xk = tl.load(x_row + ks, mask=k_mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols.to(tl.int64)[:, None] * w_stride + ks[None, :],
                    mask=col_mask[:, None] & k_mask[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * xk[None, :], axis=1)
    out = acc.to(dtype)
    if RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=col_mask, other=0.0)
        out = (out.to(tl.float32) + r.to(tl.float32)).to(dtype)
    tl.store(out_ptr + row * out_stride + cols, out, mask=col_mask)


def _blocks(n: int, k: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K): enough programs to cover the SMs at 896-wide outputs, 16-byte loads."""
    return (4 if n <= 2048 else 8 if n <= 8192 else 16), min(512, triton.next_power_of_2(k))


def fused_gemv_triton(x: torch.Tensor, weight: torch.Tensor, *, norm: torch.Tensor | None = None, eps: float = 1e-6,
                      silu_mul: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (or [M, 2K] with ``silu_mul``), weight [N, K] -> [M, N] in x's dtype; M <= MAX_ROWS."""
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    assert not (norm is not None and silu_mul), "one prologue: norm or silu_mul"
    assert x.dim() == 2 and 0 < m <= MAX_ROWS and x.shape[1] == (2 * k if silu_mul else k), (x.shape, weight.shape)
    assert weight.dtype == x.dtype and weight.stride(1) == 1, (weight.dtype, x.dtype)
    assert_last_dim_contiguous(x)
    if norm is not None:
        assert norm.shape == (k,) and norm.is_contiguous(), norm.shape
    if residual is not None:
        assert residual.shape == (m, n) and residual.dtype == x.dtype, (residual.shape, residual.dtype)
        assert_last_dim_contiguous(residual)
    out = x.new_empty(m, n)
    block_n, block_k = _blocks(n, k)
    res = residual if residual is not None else out
    _fused_gemv_kernel[(triton.cdiv(n, block_n), m)](
        x, weight, out, norm if norm is not None else weight, res,
        n, k, x.stride(0), weight.stride(0), out.stride(0), res.stride(0), eps,
        NORM=norm is not None, SILU_MUL=silu_mul, RESIDUAL=residual is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4)
    return out


def fused_gemv_ref(x: torch.Tensor, weight: torch.Tensor, *, norm: torch.Tensor | None = None, eps: float = 1e-6,
                   silu_mul: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
    """The unfused path: the same ops as separate torch calls, each rounded to x's dtype."""
    if norm is not None:
        x = F.rms_norm(x.float(), norm.shape, norm.float(), eps).to(x.dtype)
    if silu_mul:
        gate, up = x.float().chunk(2, dim=-1)
        x = (F.silu(gate) * up).to(x.dtype)
    out = F.linear(x, weight)
    if residual is not None:
        out = (out.float() + residual.float()).to(x.dtype)
    return out


def fused_gemv(x: torch.Tensor, weight: torch.Tensor, **kwargs) -> torch.Tensor:
    """Triton on CUDA, the reference elsewhere."""
    return fused_gemv_triton(x, weight, **kwargs) if use_triton(x) else fused_gemv_ref(x, weight, **kwargs)
