"""A one-row matmul (GEMV) y = x W^T in Triton, split along K, for comparing with cuBLAS at decode shapes.

Not on the engine's path yet: bench/gpu_profile.py times it beside `torch.nn.functional.linear` at each of a
model's linear shapes, so a GPU run shows whether a hand-written GEMV would read the weights faster (the 7B's
batch-1 step is bound by them). W [N, K] row-major (nn.Linear's weight); each program reduces BLOCK_N rows over
one of `split_k` slices of K; with split_k > 1 the partial sums are added atomically in float32, then cast.
The torch reference is `torch.nn.functional.linear`.
"""

import torch
import torch.nn.functional as F

from native_engine.kernels._triton import tl, triton, use_triton


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, w_stride, k_per_split,
                 ATOMIC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = tl.program_id(1) * k_per_split
    row_mask = rows < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_mask = cols < K
        x = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + rows.to(tl.int64)[:, None] * w_stride + cols[None, :],
                    mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    if ATOMIC:
        tl.atomic_add(out_ptr + rows, acc, mask=row_mask)
    else:
        tl.store(out_ptr + rows, acc.to(out_ptr.dtype.element_ty), mask=row_mask)


def gemv_triton(x: torch.Tensor, weight: torch.Tensor, block_n: int = 32, block_k: int = 256,
                split_k: int = 1) -> torch.Tensor:
    """x [1, K], weight [N, K] -> [1, N] in x's dtype (float32 accumulation)."""
    assert x.dim() == 2 and x.shape[0] == 1 and weight.dim() == 2 and x.shape[1] == weight.shape[1], (x.shape,
                                                                                                   weight.shape)
    assert x.is_contiguous() and weight.stride(1) == 1 and x.dtype == weight.dtype, (x.dtype, weight.dtype)
    n, k = weight.shape
    per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    splits = triton.cdiv(k, per_split)
    atomic = splits > 1
    out = torch.zeros(1, n, dtype=torch.float32, device=x.device) if atomic else x.new_empty(1, n)
    _gemv_kernel[(triton.cdiv(n, block_n), splits)](x, weight, out, n, k, weight.stride(0), per_split,
                                                   ATOMIC=atomic, BLOCK_N=block_n, BLOCK_K=block_k)
    return out.to(x.dtype) if atomic else out


def gemv(x: torch.Tensor, weight: torch.Tensor, **config) -> torch.Tensor:
    """Triton on CUDA, `F.linear` elsewhere."""
    return gemv_triton(x, weight, **config) if use_triton(x) else F.linear(x, weight)
