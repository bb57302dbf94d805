import torch

from native_engine.kernels import cpu_kernels
from native_engine.kernels._triton import (
    assert_last_dim_contiguous,
    tl,
    triton,
    use_triton,
)


@triton.jit
def paged_kv_tile(q, table_ptr, keys, key_mask, score_mask, k_cache_ptr, v_cache_ptr, kv_head, dims, head_dim,
                  block_size, cache_stride_b, cache_stride_s, cache_stride_h, scale, m_i, l_i, acc,
                  DOT_PRECISION: tl.constexpr):
    """One tile of a paged sequence's keys into an online softmax (log2 domain), for the decode kernel here and
    the unified one: `keys` [N] positions (`key_mask`: the ones that exist), `score_mask` [M or 1, N] the scores
    kept, `q` [M, D] in the dtype the dots run in. Returns the new (max, sum, accumulator)."""
    blocks = tl.load(table_ptr + keys // block_size, mask=key_mask, other=0)
    kv_offs = (blocks.to(tl.int64)[:, None] * cache_stride_b + (keys % block_size)[:, None] * cache_stride_s
               + kv_head * cache_stride_h + dims[None, :])
    kv_mask = key_mask[:, None] & (dims[None, :] < head_dim)
    k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * (scale * 1.4426950408889634)  # log2 domain
    s = tl.where(score_mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_out_ptr, part_ml_ptr, scale,
    q_stride_b, q_stride_h, out_stride_b, out_stride_h, block_tables_stride,
    cache_stride_b, cache_stride_s, cache_stride_h,
    block_size, group_size, head_dim, partition_size, num_splits,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
):
    seq, kv_head, split = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    heads = kv_head * group_size + tl.arange(0, BLOCK_G)  # q heads sharing this kv head
    dims = tl.arange(0, BLOCK_D)
    head_mask = tl.arange(0, BLOCK_G) < group_size
    q_mask = head_mask[:, None] & (dims[None, :] < head_dim)
    q = tl.load(q_ptr + seq * q_stride_b + heads[:, None] * q_stride_h + dims[None, :], mask=q_mask, other=0.0)
    dot_dtype = tl.float32 if DOT_FP32 else q.dtype
    q = q.to(dot_dtype)

    context_len = tl.load(context_lens_ptr + seq)
    start = split * partition_size
    end = tl.minimum(context_len, start + partition_size)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    table = block_tables_ptr + seq * block_tables_stride
    for tok_start in range(start, end, BLOCK_N):
        toks = tok_start + tl.arange(0, BLOCK_N)
        tok_mask = toks < end
        m_i, l_i, acc = paged_kv_tile(q, table, toks, tok_mask, tok_mask[None, :], k_cache_ptr, v_cache_ptr, kv_head,
                                      dims, head_dim, block_size, cache_stride_b, cache_stride_s, cache_stride_h,
                                      scale, m_i, l_i, acc, DOT_PRECISION)

    if IS_SPLIT:  # partial results [B, nh, S, D] and (m, l) [B, nh, S, 2], merged by _reduce_kernel
        row = (seq * group_size * tl.num_programs(1) + heads) * num_splits + split
        tl.store(part_out_ptr + row[:, None] * head_dim + dims[None, :], acc, mask=q_mask)
        tl.store(part_ml_ptr + row * 2, m_i, mask=head_mask)
        tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=head_mask)
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        out_offs = seq * out_stride_b + heads[:, None] * out_stride_h + dims[None, :]
        tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def _reduce_kernel(
    part_out_ptr, part_ml_ptr, out_ptr, out_stride_b, out_stride_h, num_heads, head_dim, num_splits,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    row0 = (seq * num_heads + head) * num_splits
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    m = tl.load(part_ml_ptr + (row0 + splits) * 2, mask=splits < num_splits, other=float("-inf"))
    l = tl.load(part_ml_ptr + (row0 + splits) * 2 + 1, mask=splits < num_splits, other=0.0)
    m_max = tl.max(m, axis=0)
    w = tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max))  # 0 for empty splits
    denom = tl.sum(w * l, axis=0)
    mask = (splits[:, None] < num_splits) & (dims[None, :] < head_dim)
    acc = tl.load(part_out_ptr + (row0 + splits)[:, None] * head_dim + dims[None, :], mask=mask, other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(denom == 0.0, 1.0, denom)
    tl.store(out_ptr + seq * out_stride_b + head * out_stride_h + dims, out.to(out_ptr.dtype.element_ty),
             mask=dims < head_dim)


def _check(query, k_cache, v_cache, block_tables, context_lens) -> None:
    assert query.dim() == 3 and k_cache.dim() == 4, f"query [B, nh, D], cache [N, bs, nkv, D]: {query.shape}"
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.shape[3] == query.shape[2] and query.shape[1] % k_cache.shape[2] == 0, (query.shape, k_cache.shape)
    assert query.dtype == k_cache.dtype == v_cache.dtype, (query.dtype, k_cache.dtype)
    assert query.dtype in (torch.float32, torch.float16, torch.bfloat16), query.dtype
    assert block_tables.dim() == 2 and block_tables.shape[0] == query.shape[0] and block_tables.stride(1) == 1
    assert context_lens.shape == (query.shape[0],) and context_lens.is_contiguous()
    assert block_tables.dtype in (torch.int32, torch.int64) and context_lens.dtype in (torch.int32, torch.int64)
    assert_last_dim_contiguous(query, k_cache, v_cache)


def _num_splits(batch_size: int, num_kv_heads: int, max_context_len: int) -> int:
    # split long contexts (flash-decoding) only when the grid would be too small to fill the GPU
    return max(1, min(triton.cdiv(max_context_len, 256), 1024 // (batch_size * num_kv_heads)))


def paged_attention_decode_triton(
    query: torch.Tensor,  # [B, nh, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, nkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, nkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks], -1 padded
    context_lens: torch.Tensor,  # [B]
    scale: float,
    num_splits: int | None = None,
    block_n: int = 64,
) -> torch.Tensor:  # [B, nh, D]
    _check(query, k_cache, v_cache, block_tables, context_lens)
    assert block_n >= 16 and block_n & (block_n - 1) == 0, f"block_n must be a power of two >= 16, got {block_n}"
    (batch_size, num_heads, head_dim), (block_size, num_kv_heads) = query.shape, k_cache.shape[1:3]
    out = torch.empty(batch_size, num_heads, head_dim, dtype=query.dtype, device=query.device)
    if batch_size == 0:
        return out
    max_context_len = block_tables.shape[1] * block_size
    num_splits = num_splits or _num_splits(batch_size, num_kv_heads, max_context_len)
    partition_size = triton.cdiv(triton.cdiv(max_context_len, num_splits), block_n) * block_n
    is_split = num_splits > 1
    part_out = torch.empty(batch_size * num_heads * num_splits * head_dim if is_split else 1,
                           dtype=torch.float32, device=query.device)
    part_ml = torch.empty(batch_size * num_heads * num_splits * 2 if is_split else 1,
                          dtype=torch.float32, device=query.device)
    block_d = max(16, triton.next_power_of_2(head_dim))
    # CPU tensors mean TRITON_INTERPRET, whose tl.dot is wrong for bf16 (multiplies the raw uint16 bits)
    dot_fp32 = query.dtype == torch.float32 or not query.is_cuda
    _paged_attention_kernel[(batch_size, num_kv_heads, num_splits)](
        query, k_cache, v_cache, block_tables, context_lens, out, part_out, part_ml, scale,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_size, num_heads // num_kv_heads, head_dim, partition_size, num_splits,
        BLOCK_G=max(16, triton.next_power_of_2(num_heads // num_kv_heads)), BLOCK_N=block_n, BLOCK_D=block_d,
        IS_SPLIT=is_split, DOT_PRECISION="ieee" if dot_fp32 else "tf32", DOT_FP32=dot_fp32,
    )
    if is_split:
        _reduce_kernel[(batch_size, num_heads)](
            part_out, part_ml, out, out.stride(0), out.stride(1), num_heads, head_dim, num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
        )
    return out


def paged_attention_decode_ref(
    query: torch.Tensor,  # [B, nh, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, nkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, nkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks], -1 padded
    context_lens: torch.Tensor,  # [B]
    scale: float,
) -> torch.Tensor:  # [B, nh, D]
    (batch_size, num_heads, head_dim), (block_size, num_kv_heads) = query.shape, k_cache.shape[1:3]
    min_len, max_len = (int(n) for n in context_lens.aminmax()) if batch_size else (0, 0)
    if max_len == 0:
        return torch.zeros_like(query)
    tables = block_tables[:, : -(-max_len // block_size)].clamp(min=0).long()
    k = k_cache[tables].flatten(1, 2)[:, :max_len].float()  # [B, L, nkv, D]
    v = v_cache[tables].flatten(1, 2)[:, :max_len].float()
    q = query.reshape(batch_size, num_kv_heads, -1, head_dim).float() * scale  # [B, nkv, group, D]
    scores = q @ k.permute(0, 2, 3, 1)  # [B, nkv, group, L]
    if min_len < max_len:
        is_pad = torch.arange(max_len, device=query.device) >= context_lens[:, None]  # [B, L]
        scores.masked_fill_(is_pad[:, None, None, :], float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v.transpose(1, 2)  # [B, nkv, group, D]
    if min_len == 0:
        out.masked_fill_((context_lens == 0).view(-1, 1, 1, 1), 0.0)  # fully masked rows are nan
    return out.view(batch_size, num_heads, head_dim).to(query.dtype)


def paged_attention_decode(
    query: torch.Tensor,  # [B, nh, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, nkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, nkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks], -1 padded
    context_lens: torch.Tensor,  # [B]
    scale: float,
) -> torch.Tensor:  # [B, nh, D]
    if use_triton(query):
        fn = paged_attention_decode_triton
    elif cpu_kernels.serves(query, k_cache) and k_cache.is_contiguous() and v_cache.is_contiguous():
        fn = cpu_kernels.paged_attention_decode
    else:
        fn = paged_attention_decode_ref
    return fn(query, k_cache, v_cache, block_tables, context_lens, scale)
