"""Paged attention over the KV cache: decode rows through the paged kernel, prefill chunks
through `scaled_dot_product_attention` over the sequence's gathered blocks; on CUDA a step with prefill
chunks runs all its rows in one kernel instead (`kernels/unified_attention.py`, EngineConfig.unified_attention).

Same input, same output: on CPU in float32 a prefill token's numbers do not depend on the chunk it was
computed in nor on how much of the prompt the prefix cache served (`_canonical_flash_attention`; the
linear kernels are row-invariant for chunks of two or more tokens). Where they still differ: a chunk of a
single token is a decode row (the paged decode kernel, another summation order), and bf16 or GPU prefills
use the kernels' own blocking. The float32 engine's bf16 prefill (`bf16_prefill.py`) keeps the canonical
blocking, on bf16 q/k/v: chunking and the prefix cache do not change its numbers either."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import paged_attention_decode, reshape_and_cache, unified_attention
from ..forward_context import Context, PrefillChunk


def gather_blocks(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """cache: [num_blocks, block_size, nkv, D] -> the first `length` tokens of a sequence, [length, nkv, D]."""
    blocks = cache.index_select(0, block_table)
    return blocks.flatten(0, 1)[:length]


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cached: int, scale: float
) -> torch.Tensor:  # q: [n, nh, D]; k, v: [num_cached + n, nkv, D] -> [n, nh, D]
    n, total = q.shape[0], k.shape[0]
    if q.device.type == "cpu" and q.dtype == torch.float32:
        return _canonical_flash_attention(q, k, v, num_cached, scale)
    if num_cached == 0:
        mask, causal = None, True
    else:
        rows = torch.arange(n, device=q.device)[:, None] + num_cached
        mask, causal = torch.arange(total, device=q.device)[None, :] <= rows, False
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    if q.device.type == "cpu" and k.shape[0] != q.shape[0]:  # 3-D inputs: the math kernel, also for `enable_gqa`
        k, v = (x.repeat_interleave(q.shape[0] // k.shape[0], dim=0) for x in (k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                         enable_gqa=k.shape[0] != q.shape[0])
    return out.transpose(0, 1)


def _canonical_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cached: int,
                               scale: float) -> torch.Tensor:
    """PyTorch's CPU flash kernel ([1, heads, tokens, D] with a batch dimension: ~3x the math kernel at 512
    tokens, GQA included), called so that a token's numbers depend only on its position and its keys, not
    on how its prompt was chunked or how much of it came from the prefix cache.

    The kernel splits the queries into blocks of 32/64/256 rows and the keys into blocks of up to 512 from
    the call's start, and its matmuls round a row differently when it sits in a partial tile or when the
    key count changes (MKL picks its GEMM path by shape). So:
    - the queries are padded with zero rows to start and end on multiples of `_Q_UNIT` absolute positions;
    - a query row at position p is computed against a key count that depends on p alone, `key_span(p)`: the
      first of `_KV_SPANS` above p, then the next multiple of `_KV_BLOCK` (the keys zero-padded to it, an
      explicit mask hiding what the row may not see; masked keys add exact zeros). Rows are computed in
      groups of one span each, one kernel call per group (a short prompt: one call against 64 keys).
    Cached and uncached prefills, and any chunking, give bit-identical outputs
    (tests/native_engine/test_attention.py). The cost against one causal call: each group computes its whole
    [rows, span] rectangle instead of skipping the keys above the diagonal."""
    n, total = q.shape[0], k.shape[0]
    if n == 0:
        return q.clone()
    front = num_cached % _Q_UNIT
    back = -(front + n) % _Q_UNIT
    if front or back:
        q = torch.cat([q.new_zeros(front, *q.shape[1:]), q, q.new_zeros(back, *q.shape[1:])])
    first = num_cached - front  # the absolute position of the padded queries' first row (a multiple of _Q_UNIT)
    q = q.transpose(0, 1)
    outs, row = [], 0
    while row < q.shape[1]:
        span = key_span(first + row)
        end = min(q.shape[1], span - first)  # the rows this span serves: positions below it (and above the last)
        keys, values = k[:span], v[:span]
        if keys.shape[0] < span:
            keys, values = (torch.cat([x, x.new_zeros(span - x.shape[0], *x.shape[1:])]) for x in (keys, values))
        mask = span_mask(first + row, end - row, span, total - 1, q.dtype)
        out = F.scaled_dot_product_attention(q[None, :, row:end], keys.transpose(0, 1)[None],
                                             values.transpose(0, 1)[None], attn_mask=mask, scale=scale,
                                             enable_gqa=keys.shape[1] != q.shape[0])
        outs.append(out[0])
        row = end
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    return out.transpose(0, 1)[front : front + n]


def bf16_canonical_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cached: int,
                             scale: float) -> torch.Tensor:
    """`_canonical_flash_attention` on bf16 copies of float32 q/k/v, the output float32 (`bf16_prefill.py`)."""
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    return _canonical_flash_attention(q, k, v, num_cached, scale).float()


_Q_UNIT, _KV_BLOCK = 16, 512
_KV_SPANS = (64, 128, 256, 512)  # each a multiple of _Q_UNIT; the last = _KV_BLOCK
_MAX_KEPT_MASK = 1 << 22  # mask elements kept for the next layers (16 MB in float32); larger ones are rebuilt


def span_mask(first: int, rows: int, span: int, last: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask [rows, span] of query rows at positions first.. (the padding rows past `last`
    see what `last` sees) against `span` keys: 0 where a row sees the key, -inf elsewhere (what the
    kernel makes of a bool mask). Every layer of a step asks for the same ones: kept while small."""
    if rows * span > _MAX_KEPT_MASK:
        return _build_span_mask(first, rows, span, last, dtype)
    return _kept_span_mask(first, rows, span, last, dtype)


def _build_span_mask(first: int, rows: int, span: int, last: int, dtype: torch.dtype) -> torch.Tensor:
    positions = torch.arange(first, first + rows).clamp_(max=last)
    visible = torch.arange(span)[None, :] <= positions[:, None]
    return torch.zeros(rows, span, dtype=dtype).masked_fill_(~visible, float("-inf"))


_kept_span_mask = functools.lru_cache(maxsize=16)(_build_span_mask)


def key_span(position: int) -> int:
    """The key count a query row at ``position`` is computed against: fixed per position, so a row's numbers
    never depend on the call it is in."""
    for span in _KV_SPANS:
        if position < span:
            return span
    return (position // _KV_BLOCK + 1) * _KV_BLOCK


class Attention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.scale, self.num_kv_heads = num_heads, head_dim, scale, num_kv_heads
        self.k_cache = self.v_cache = torch.tensor([])
        self.bf16_prefill = False  # prefill chunks on bf16 q/k/v (`bf16_prefill.py`); the cache stays float32

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: Context, cached: bool = False
                ) -> torch.Tensor:
        # q: [T, nh * D]; k, v: [T, nkv * D] -> [T, nh * D]; cached: k and v are in the KV cache already
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.k_cache.numel() and ctx.slot_mapping is not None and not cached:
            reshape_and_cache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
        if ctx.query_start is not None and self.k_cache.numel():  # a mixed step, every row in one kernel
            return unified_attention(q, self.k_cache, self.v_cache, ctx.row_tables, ctx.query_start, ctx.seq_lens,
                                     self.scale, ctx.max_query_len).flatten(1)
        num_decodes = ctx.num_decode_tokens
        if num_decodes and not ctx.prefills and num_decodes == q.shape[0]:  # decode-only: the kernel's own output
            out = paged_attention_decode(q, self.k_cache, self.v_cache, ctx.block_tables, ctx.context_lens, self.scale)
            return out.flatten(1)
        out = torch.empty_like(q)
        if num_decodes:
            out[:num_decodes] = paged_attention_decode(
                q[:num_decodes], self.k_cache, self.v_cache, ctx.block_tables, ctx.context_lens, self.scale
            )
        for chunk in ctx.prefills:
            out[chunk.query_start : chunk.query_start + chunk.query_len] = self._prefill(chunk, q, k, v)
        return out.flatten(1)

    def _prefill(self, chunk: PrefillChunk, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rows = slice(chunk.query_start, chunk.query_start + chunk.query_len)
        num_cached = chunk.context_len - chunk.query_len
        attend = bf16_canonical_attention if self.bf16_prefill else prefill_attention
        if num_cached == 0 or not self.k_cache.numel():
            return attend(q[rows], k[rows], v[rows], 0, self.scale)
        keys = gather_blocks(self.k_cache, chunk.block_table, chunk.context_len)
        values = gather_blocks(self.v_cache, chunk.block_table, chunk.context_len)
        return attend(q[rows], keys, values, num_cached, self.scale)
