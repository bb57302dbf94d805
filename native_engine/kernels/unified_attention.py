"""Paged attention for a whole mixed step in one launch: decode rows and prefill chunks alike read their keys
and values from the paged KV cache (vLLM v1's unified Triton attention does the same).

A row is one sequence's query tokens this step: one for a decode, `query_len` for a prefill chunk, laid out one
after another (`query_start`: [rows + 1] offsets into the flat batch). Its keys are the sequence's first
`seq_len` cached tokens (the chunk's own keys were written to the cache before), and query token i of the row
sees keys 0 .. seq_len - query_len + i (causal with a cached prefix).

Each program takes BLOCK_Q tokens of one row and the `group` query heads that share one KV head: a
[BLOCK_M = BLOCK_Q x group (padded), D] tile of queries against key tiles of BLOCK_N, online softmax in
float32. Which row a program works on comes from a binary search over `query_start` (row r owns program ids
query_start[r] // BLOCK_Q + r onwards), so the launch grid depends only on the token and row counts, never on
the rows' lengths: the host needs no per-step arithmetic beyond the offsets it already has.

It replaces attention.py's per-chunk path, which launches two to eight kernels a chunk in every layer (the
attention call and a copy; after a cached prefix also two gathers of the sequence's blocks and a mask)."""

from __future__ import annotations

import torch

from native_engine.kernels._triton import assert_last_dim_contiguous, tl, triton, use_triton
from native_engine.kernels.paged_attention import paged_kv_tile


@triton.jit
def _unified_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_ptr, seq_lens_ptr, out_ptr, scale,
    q_stride_t, q_stride_h, out_stride_t, out_stride_h, block_tables_stride,
    cache_stride_b, cache_stride_s, cache_stride_h,
    num_rows, block_size, group_size, head_dim,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
):
    program, kv_head = tl.program_id(0), tl.program_id(1)
    lo: tl.int32 = 0  # binary search: the last row whose first program id is <= this one
    hi: tl.int32 = num_rows
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_ptr + mid) // BLOCK_Q + mid <= program:
            lo = mid + 1
        else:
            hi = mid
    row = lo - 1
    q_start = tl.load(query_start_ptr + row)
    q_len = tl.load(query_start_ptr + row + 1) - q_start
    first = (program - (q_start // BLOCK_Q + row)) * BLOCK_Q  # this program's first token within the row
    if first < q_len:
        m = tl.arange(0, BLOCK_M)
        tok = first + m // group_size  # query token within the row
        head = kv_head * group_size + m % group_size
        dims = tl.arange(0, BLOCK_D)
        row_mask = (m // group_size < BLOCK_Q) & (tok < q_len)
        q_mask = row_mask[:, None] & (dims[None, :] < head_dim)
        token = (q_start + tok).to(tl.int64)
        q = tl.load(q_ptr + token[:, None] * q_stride_t + head[:, None] * q_stride_h + dims[None, :], mask=q_mask,
                    other=0.0)
        dot_dtype = tl.float32 if DOT_FP32 else q.dtype
        q = q.to(dot_dtype)

        seq_len = tl.load(seq_lens_ptr + row)
        cached = seq_len - q_len  # keys before this chunk
        last = tl.minimum(first + BLOCK_Q, q_len)  # one past the program's last token
        end = cached + last  # keys the program's last token sees
        visible = cached + tok  # the last key each query row sees
        table = block_tables_ptr + row.to(tl.int64) * block_tables_stride
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for tok_start in range(0, end, BLOCK_N):  # key 0 is visible to every row: no row's max stays -inf
            keys = tok_start + tl.arange(0, BLOCK_N)
            key_mask = keys < end
            score_mask = key_mask[None, :] & (keys[None, :] <= visible[:, None])
            m_i, l_i, acc = paged_kv_tile(q, table, keys, key_mask, score_mask, k_cache_ptr, v_cache_ptr, kv_head,
                                          dims, head_dim, block_size, cache_stride_b, cache_stride_s, cache_stride_h,
                                          scale, m_i, l_i, acc, DOT_PRECISION)
        out = acc / l_i[:, None]
        out_offs = token[:, None] * out_stride_t + head[:, None] * out_stride_h + dims[None, :]
        tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def _check(query, k_cache, v_cache, block_tables, query_start, seq_lens) -> None:
    assert query.dim() == 3 and k_cache.dim() == 4, f"query [T, nh, D], cache [N, bs, nkv, D]: {query.shape}"
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.shape[3] == query.shape[2] and query.shape[1] % k_cache.shape[2] == 0, (query.shape, k_cache.shape)
    assert query.dtype == k_cache.dtype == v_cache.dtype, (query.dtype, k_cache.dtype)
    rows = seq_lens.shape[0]
    assert query_start.shape == (rows + 1,) and block_tables.dim() == 2 and block_tables.shape[0] >= rows
    assert block_tables.stride(1) == 1 and query_start.is_contiguous() and seq_lens.is_contiguous()
    assert_last_dim_contiguous(query, k_cache, v_cache)


def block_shape(group: int, max_query_len: int) -> tuple[int, int]:
    """(BLOCK_Q, BLOCK_M): decode-only steps take one token a program (16 rows of heads, as the decode kernel);
    steps with prefill chunks up to 64 query rows (tokens x heads) a program."""
    block_m = max(16, triton.next_power_of_2(group))
    if max_query_len > 1:
        block_m = max(block_m, 64)
    return max(1, block_m // group), block_m


def unified_attention_triton(
    query: torch.Tensor,  # [T, nh, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, nkv, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [rows, max_blocks] int32, -1 padded
    query_start: torch.Tensor,  # [rows + 1]: each row's first token in the flat batch, then T
    seq_lens: torch.Tensor,  # [rows]: keys each row's sequence has after this step
    scale: float,
    max_query_len: int,
    block_n: int = 32,
) -> torch.Tensor:  # [T, nh, D]
    _check(query, k_cache, v_cache, block_tables, query_start, seq_lens)
    (num_tokens, num_heads, head_dim), (block_size, num_kv_heads) = query.shape, k_cache.shape[1:3]
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=query.dtype, device=query.device)
    rows = seq_lens.shape[0]
    if num_tokens == 0:
        return out
    group = num_heads // num_kv_heads
    block_q, block_m = block_shape(group, max_query_len)
    # CPU tensors mean TRITON_INTERPRET, whose tl.dot is wrong for bf16 (multiplies the raw uint16 bits)
    dot_fp32 = query.dtype == torch.float32 or not query.is_cuda
    _unified_attention_kernel[(num_tokens // block_q + rows, num_kv_heads)](
        query, k_cache, v_cache, block_tables, query_start, seq_lens, out, scale,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        rows, block_size, group, head_dim,
        BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        DOT_PRECISION="ieee" if dot_fp32 else "tf32", DOT_FP32=dot_fp32,
    )
    return out


def unified_attention_ref(query, k_cache, v_cache, block_tables, query_start, seq_lens, scale: float,
                          max_query_len: int = 0) -> torch.Tensor:
    """Row by row in float32: the row's keys gathered from its blocks, a causal mask shifted by its cached
    prefix. `max_query_len` is the launcher's (unused)."""
    block_size, num_kv_heads = k_cache.shape[1:3]
    group = query.shape[1] // num_kv_heads
    out = torch.empty_like(query)
    starts, lens = query_start.tolist(), seq_lens.tolist()
    for row, seq_len in enumerate(lens):
        a, b = starts[row], starts[row + 1]
        if a == b:
            continue
        table = block_tables[row, : -(-seq_len // block_size)].long()
        k = k_cache[table].flatten(0, 1)[:seq_len].float().repeat_interleave(group, dim=1)  # [L, nh, D]
        v = v_cache[table].flatten(0, 1)[:seq_len].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[a:b].float() * scale, k)
        visible = torch.arange(seq_len, device=query.device)[None, :] <= (seq_len - (b - a)) + torch.arange(
            b - a, device=query.device)[:, None]
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out[a:b] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return out


def unified_attention(query, k_cache, v_cache, block_tables, query_start, seq_lens, scale: float,
                      max_query_len: int) -> torch.Tensor:
    fn = unified_attention_triton if use_triton(query) else unified_attention_ref
    return fn(query, k_cache, v_cache, block_tables, query_start, seq_lens, scale, max_query_len)
