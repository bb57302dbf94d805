"""Punica's SGMV (segmented gather matrix-vector) for LoRA: every adapter's rows of a step in one launch each
for the shrink (`xa = x · Aᵀ`) and the expand (`out += xa · Bᵀ`).

The step's rows come as segments (first row, rows, adapter slot: `lora/punica.py`'s `LoRAMapping`); the
adapters' weights are stacked over slots, A [L, R, K] and B transposed, Bᵀ [L, R, N] (so a slot's first r
rows are a row-major [r, N] view, which a batched matmul takes without a copy), R the largest rank (times the
packed shards), each slot's own rank in `ranks` (columns past it are never read). One program computes a
BLOCK_M x BLOCK_R (shrink) or BLOCK_M x BLOCK_N (expand) tile of one segment, in float32 (`tl.dot` with
"ieee" precision: the interpreter's dot of bf16 multiplies raw bits, and LoRA is a small share of a step).
The torch reference is the segmented matmul `sgmv_ref`. On the CPU, `sgmv_torch` runs consecutive runs of
equal length on consecutive slots (16 decode rows over 8 adapters, ordered by slot: one batch) as one
batched matmul on views, so its cost does not grow with the number of adapters.
"""

import torch

from native_engine.kernels._triton import assert_last_dim_contiguous, tl, triton


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, xa_ptr, seg_start_ptr, seg_len_ptr, seg_slot_ptr, rank_ptr, K,
                   x_stride, a_stride_l, a_stride_r, xa_stride,
                   BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    seg = tl.program_id(0)
    start, length, slot = tl.load(seg_start_ptr + seg), tl.load(seg_len_ptr + seg), tl.load(seg_slot_ptr + seg)
    rank = tl.load(rank_ptr + slot)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask, col_mask = rows < length, cols < rank
    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + (start + rows).to(tl.int64)[:, None] * x_stride + ks[None, :],
                    mask=row_mask[:, None] & (ks < K)[None, :], other=0.0).to(tl.float32)
        a = tl.load(a_ptr + slot.to(tl.int64) * a_stride_l + cols[:, None] * a_stride_r + ks[None, :],
                    mask=col_mask[:, None] & (ks < K)[None, :], other=0.0).to(tl.float32)
        acc += tl.dot(x, tl.trans(a), input_precision="ieee")
    tl.store(xa_ptr + (start + rows).to(tl.int64)[:, None] * xa_stride + cols[None, :], acc,
             mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _expand_kernel(xa_ptr, b_ptr, out_ptr, seg_start_ptr, seg_len_ptr, seg_slot_ptr, rank_ptr, N,
                   xa_stride, b_stride_l, b_stride_r, out_stride,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    seg = tl.program_id(0)
    start, length, slot = tl.load(seg_start_ptr + seg), tl.load(seg_len_ptr + seg), tl.load(seg_slot_ptr + seg)
    rank = tl.load(rank_ptr + slot)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask, col_mask = rows < length, cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for r0 in range(0, rank, BLOCK_R):
        rs = r0 + tl.arange(0, BLOCK_R)
        xa = tl.load(xa_ptr + (start + rows).to(tl.int64)[:, None] * xa_stride + rs[None, :],
                     mask=row_mask[:, None] & (rs < rank)[None, :], other=0.0)
        b = tl.load(b_ptr + slot.to(tl.int64) * b_stride_l + rs[:, None] * b_stride_r + cols[None, :],
                    mask=(rs < rank)[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
        acc += tl.dot(xa, b, input_precision="ieee")
    where = out_ptr + (start + rows).to(tl.int64)[:, None] * out_stride + cols[None, :]
    mask = row_mask[:, None] & col_mask[None, :]
    out = tl.load(where, mask=mask, other=0.0).to(tl.float32)
    tl.store(where, (out + acc).to(out_ptr.dtype.element_ty), mask=mask)


def sgmv_triton(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, ranks: torch.Tensor,
                segments: torch.Tensor, max_len: int, block_m: int = 16) -> torch.Tensor:
    """out[rows of each segment] += (x · A[slot]ᵀ) · Bᵀ[slot] in place; returns out.
    x [T, K], out [T, N], a [L, R, K], bt [L, R, N], ranks [L] int32, segments [3, S] int32 (first row, rows,
    slot), max_len: the longest segment."""
    b = bt
    assert x.dim() == 2 and out.dim() == 2 and a.dim() == 3 and b.dim() == 3, (x.shape, out.shape, a.shape, b.shape)
    assert a.shape[2] == x.shape[1] and b.shape[2] == out.shape[1] and a.shape[1] == b.shape[1], (a.shape, b.shape)
    assert segments.dim() == 2 and segments.shape[0] == 3 and segments.dtype == torch.int32, segments.shape
    assert_last_dim_contiguous(x, out, a, b)
    num_segments, rank_cap, (num_tokens, n), k = segments.shape[1], a.shape[1], out.shape, x.shape[1]
    xa = torch.zeros(num_tokens, rank_cap, dtype=torch.float32, device=x.device)
    if num_segments == 0 or max_len == 0:
        return out
    starts, lens, slots = segments
    block_r = max(16, min(triton.next_power_of_2(rank_cap), 64))
    _shrink_kernel[(num_segments, triton.cdiv(max_len, block_m), triton.cdiv(rank_cap, block_r))](
        x, a, xa, starts, lens, slots, ranks, k, x.stride(0), a.stride(0), a.stride(1), xa.stride(0),
        BLOCK_M=block_m, BLOCK_R=block_r, BLOCK_K=64)
    block_n = 64
    _expand_kernel[(num_segments, triton.cdiv(max_len, block_m), triton.cdiv(n, block_n))](
        xa, b, out, starts, lens, slots, ranks, n, xa.stride(0), b.stride(0), b.stride(1), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_R=block_r)
    return out


def sgmv_ref(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, ranks: list[int],
             segments: list[tuple[int, int, int]]) -> torch.Tensor:
    """The segmented matmul in torch: (first row, end row, slot) segments, each slot's first `ranks[slot]`
    rows of A and of Bᵀ (widened to x's dtype when stored narrower)."""
    for start, end, slot in segments:
        r = ranks[slot]
        out[start:end].addmm_(x[start:end] @ a[slot, :r].to(x.dtype).T, bt[slot, :r].to(x.dtype))
    return out


def batches(segments: list[tuple[int, int, int]]) -> list[tuple[int, int, int, int]]:
    """(first row, runs, rows each, first slot): consecutive (first row, end row, slot) runs of one length on
    consecutive rows and slots, merged."""
    out: list[tuple[int, int, int, int]] = []
    for start, end, slot in segments:
        if out:
            first, count, length, slot0 = out[-1]
            if end - start == length and start == first + count * length and slot == slot0 + count:
                out[-1] = (first, count + 1, length, slot0)
                continue
        out.append((start, 1, end - start, slot))
    return out


def sgmv_torch(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, ranks: list[int],
               runs: list[tuple[int, int, int, int]],
               blocks: list[list[tuple[int, int, int, int]]] | None = None) -> torch.Tensor:
    """`sgmv_ref` over `batches(segments)`: a batch of runs as one bmm of views (rows past a slot's rank are
    zeros in `a` and `bt`, so the batch's widest rank serves all). `blocks`: per slot, the non-zero blocks of
    its Bᵀ (first column, end column, first output, end output; lora/punica.py); a run of one slot expands
    block by block, skipping the zeros between a packed linear's shards (2/3 of qkv's Bᵀ, half of gate_up's).
    Stacks stored narrower than x (float16 on the CPU: lora/punica.py) are widened piece by piece."""
    for start, count, length, slot in runs:
        r = max(ranks[slot : slot + count])
        if r == 0:
            continue
        end = start + count * length
        if count == 1 or not (x.is_contiguous() and out.is_contiguous()):
            for i in range(count):
                rows = slice(start + i * length, start + (i + 1) * length)
                xa, b = x[rows] @ a[slot + i, :r].to(x.dtype).T, bt[slot + i, :r].to(x.dtype)  # one widening each
                for c0, c1, o0, o1 in blocks[slot + i] if blocks else [(0, r, 0, out.shape[1])]:
                    out[rows, o0:o1].addmm_(xa[:, c0:c1], b[c0:c1, o0:o1])
            continue
        xa = torch.bmm(x[start:end].view(count, length, -1), a[slot : slot + count, :r].to(x.dtype).transpose(1, 2))
        out[start:end].view(count, length, -1).baddbmm_(xa, bt[slot : slot + count, :r].to(x.dtype))
    return out
