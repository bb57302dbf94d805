"""The unified attention kernel (one launch for a mixed step's decode rows and prefill chunks) against a naive
float64 attention, token by token, over the same paged cache."""

import pytest
import torch
import torch.nn.functional as F

from native_engine.kernels.unified_attention import (
    block_shape,
    unified_attention,
    unified_attention_ref,
    unified_attention_triton,
)
from tests.native_engine.kernels.helpers import DTYPES, on_gpu_only_if, randn, tolerances

# (keys after the step, query tokens this step): decodes (1 query), a fresh prompt, chunks after a cached
# prefix, one longer than a program's tokens, block boundaries
MIXED = [(17, 1), (1, 1), (33, 1), (40, 40), (50, 13), (5, 5), (130, 70), (16, 16), (64, 1)]


def make_inputs(rows, num_heads, num_kv_heads, head_dim, dtype, device, block_size=16):
    blocks_per_row = [-(-n // block_size) for n, _ in rows]
    num_blocks = sum(blocks_per_row) + 3
    ids = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).tolist()
    tables = torch.full((len(rows), max(blocks_per_row) + 1), -1, dtype=torch.int32)
    for r, n in enumerate(blocks_per_row):
        tables[r, :n] = torch.tensor([ids.pop() for _ in range(n)], dtype=torch.int32)
    k_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device, seed=1)
    v_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device, seed=2)
    num_tokens = sum(q for _, q in rows)
    qkv = randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, dtype=dtype, device=device)
    query = qkv[:, :num_heads]  # a strided view, as sliced from the qkv projection
    starts = torch.tensor([0] + [q for _, q in rows], dtype=torch.int64).cumsum(0)
    seq_lens = torch.tensor([n for n, _ in rows], dtype=torch.int64)
    return query, k_cache, v_cache, tables.to(device), starts.to(device), seq_lens.to(device)


def naive(query, k_cache, v_cache, tables, starts, seq_lens, scale):
    """Each query token on its own: its visible keys looked up slot by slot, float64 attention."""
    block_size, num_kv_heads = k_cache.shape[1:3]
    group = query.shape[1] // num_kv_heads
    out = torch.zeros_like(query, dtype=torch.float64)
    for r, seq_len in enumerate(seq_lens.tolist()):
        a, b = int(starts[r]), int(starts[r + 1])
        for i in range(b - a):
            visible = seq_len - (b - a) + i + 1
            slots = [(int(tables[r, t // block_size]), t % block_size) for t in range(visible)]
            k = torch.stack([k_cache[blk, off] for blk, off in slots]).double().transpose(0, 1)
            v = torch.stack([v_cache[blk, off] for blk, off in slots]).double().transpose(0, 1)
            k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
            q = query[a + i].double().unsqueeze(1)  # [nh, 1, D]
            out[a + i] = F.scaled_dot_product_attention(q, k, v, scale=scale).squeeze(1)
    return out.to(query.dtype)


def max_query_len(starts):
    return int((starts[1:] - starts[:-1]).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80])
def test_triton_matches_naive_attention_on_a_mixed_step(device, dtype, head_dim):
    on_gpu_only_if(device, head_dim == 64)
    inputs = make_inputs(MIXED, 14, 2, head_dim, dtype, device)
    scale = head_dim ** -0.5
    out = unified_attention_triton(*inputs, scale, max_query_len(inputs[4]))
    torch.testing.assert_close(out, naive(*inputs, scale), **tolerances(dtype))


@pytest.mark.parametrize("group", [1, 2, 7, 8])
def test_triton_gqa_ratios(device, group):
    on_gpu_only_if(device, group == 7)
    inputs = make_inputs(MIXED, 2 * group, 2, 64, torch.float32, device)
    out = unified_attention_triton(*inputs, 0.125, max_query_len(inputs[4]))
    torch.testing.assert_close(out, naive(*inputs, 0.125), **tolerances(torch.float32))


@pytest.mark.parametrize("rows", [[(9, 1), (70, 1), (1, 1)], [(150, 150)], [(3, 3), (1, 1)]],
                         ids=["decode-only", "one-long-prompt", "short"])
def test_triton_on_decode_only_and_single_prompt_steps(device, rows):
    on_gpu_only_if(device, True)
    inputs = make_inputs(rows, 8, 2, 64, torch.float32, device)
    out = unified_attention_triton(*inputs, 0.125, max_query_len(inputs[4]), block_n=16)
    torch.testing.assert_close(out, naive(*inputs, 0.125), **tolerances(torch.float32))


def test_reference_matches_naive_attention():
    inputs = make_inputs(MIXED, 14, 2, 64, torch.float32, "cpu")
    torch.testing.assert_close(unified_attention_ref(*inputs, 0.125), naive(*inputs, 0.125), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(unified_attention(*inputs, 0.125, 70), naive(*inputs, 0.125), atol=1e-5, rtol=1e-5)


def test_block_shapes():
    assert block_shape(1, 1) == (16, 16) and block_shape(7, 1) == (2, 16)  # decode-only: 16 rows of heads
    assert block_shape(7, 64) == (9, 64) and block_shape(1, 64) == (64, 64)  # with prefill chunks: 64 rows
    assert block_shape(32, 2) == (2, 64)
