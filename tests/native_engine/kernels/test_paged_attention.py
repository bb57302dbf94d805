import pytest
import torch
import torch.nn.functional as F

from native_engine.kernels.paged_attention import (
    paged_attention_decode,
    paged_attention_decode_ref,
    paged_attention_decode_triton,
)
from tests.native_engine.kernels.helpers import DTYPES, randn, tolerances

CONTEXT_LENS = [1, 15, 16, 17, 33, 0]  # block boundaries and an empty (padding) row


def make_inputs(context_lens, num_heads, num_kv_heads, head_dim, dtype, device, block_size=16, extra_blocks=1):
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + 2
    ids = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).tolist()
    block_tables = torch.full((len(context_lens), max(blocks_per_seq) + extra_blocks), -1, dtype=torch.int32)
    for row, n in enumerate(blocks_per_seq):
        block_tables[row, :n] = torch.tensor([ids.pop() for _ in range(n)], dtype=torch.int32)
    k_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device, seed=1)
    v_cache = randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device, seed=2)
    qkv = randn(len(context_lens), num_heads + 2 * num_kv_heads, head_dim, dtype=dtype, device=device)
    query = qkv[:, :num_heads]  # strided view, as sliced from the qkv projection
    lens = torch.tensor(context_lens, dtype=torch.int32, device=device)
    return query, k_cache, v_cache, block_tables.to(device), lens


def paged_attention_sdpa_naive(query, k_cache, v_cache, block_tables, context_lens, scale):
    block_size, num_kv_heads = k_cache.shape[1:3]
    group = query.shape[1] // num_kv_heads
    out = torch.zeros_like(query, dtype=torch.float64)
    for b, n in enumerate(context_lens.tolist()):
        if n == 0:
            continue
        slots = [(int(block_tables[b, t // block_size]), t % block_size) for t in range(n)]
        k = torch.stack([k_cache[blk, off] for blk, off in slots]).double().transpose(0, 1)  # [nkv, n, D]
        v = torch.stack([v_cache[blk, off] for blk, off in slots]).double().transpose(0, 1)
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
        out[b] = F.scaled_dot_product_attention(query[b].double().unsqueeze(1), k, v, scale=scale).squeeze(1)
    return out.to(query.dtype)


def check_triton(inputs, dtype, **kwargs):
    scale = inputs[0].shape[-1] ** -0.5
    out = paged_attention_decode_triton(*inputs, scale, **kwargs)
    torch.testing.assert_close(out, paged_attention_decode_ref(*inputs, scale), **tolerances(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80])
def test_triton_matches_reference(device, dtype, head_dim):
    check_triton(make_inputs(CONTEXT_LENS, 14, 2, head_dim, dtype, device), dtype)


@pytest.mark.parametrize("group", [1, 2, 7])
def test_triton_gqa_ratios(device, group):
    check_triton(make_inputs(CONTEXT_LENS, 2 * group, 2, 64, torch.float32, device), torch.float32)


@pytest.mark.parametrize("num_splits", [2, 3, 5])
def test_triton_split_kv(device, num_splits):
    inputs = make_inputs([*CONTEXT_LENS, 70], 4, 2, 64, torch.bfloat16, device)
    check_triton(inputs, torch.bfloat16, num_splits=num_splits, block_n=16)


@pytest.mark.parametrize("block_size", [8, 32])
def test_triton_block_sizes(device, block_size):
    inputs = make_inputs(CONTEXT_LENS, 4, 1, 64, torch.float32, device, block_size=block_size)
    check_triton(inputs, torch.float32, block_n=16)


def test_triton_default_splits_long_context(device):
    inputs = make_inputs([300], 4, 1, 64, torch.float16, device, extra_blocks=2)  # 21 blocks -> 2 splits
    check_triton(inputs, torch.float16)


def test_triton_asserts_head_ratio():
    pytest.importorskip("triton")
    query, k_cache, v_cache, block_tables, lens = make_inputs([3], 4, 3, 64, torch.float32, "cpu")
    with pytest.raises(AssertionError):
        paged_attention_decode_triton(query, k_cache, v_cache, block_tables, lens, 0.125)
    with pytest.raises(AssertionError):
        paged_attention_decode_triton(query.half(), k_cache, v_cache, block_tables, lens, 0.125)


@pytest.mark.parametrize("dtype", DTYPES[:2])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(2, 2), (14, 2)])
def test_reference_matches_sdpa(dtype, num_heads, num_kv_heads):
    inputs = make_inputs(CONTEXT_LENS, num_heads, num_kv_heads, 80, dtype, "cpu")
    want = paged_attention_sdpa_naive(*inputs, 0.1)
    torch.testing.assert_close(paged_attention_decode_ref(*inputs, 0.1), want, **tolerances(dtype))


def test_reference_empty_contexts_give_zeros():
    query, k_cache, v_cache, block_tables, lens = make_inputs([0, 0], 4, 2, 16, torch.float32, "cpu")
    assert not paged_attention_decode_ref(query, k_cache, v_cache, block_tables, lens, 0.25).any()
    assert paged_attention_decode_ref(query[:0], k_cache, v_cache, block_tables[:0], lens[:0], 0.25).shape == (0, 4, 16)


def test_dispatcher_matches_reference_on_cpu():  # the C kernel (f32) or the reference
    inputs = make_inputs([5, 20], 4, 2, 32, torch.float32, "cpu")
    torch.testing.assert_close(paged_attention_decode(*inputs, 0.2), paged_attention_decode_ref(*inputs, 0.2),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_verify_rows(device, dtype):
    """Speculative decoding's verify rows: 1 + k queries of one sequence, its block table repeated, context
    lengths c + 1 .. c + 1 + k (query j sees the drafts before it), beside an ordinary decode row."""
    c, k = 29, 4
    query, k_cache, v_cache, tables, _ = make_inputs([c + 1 + k, 9], 4, 2, 64, dtype, device)
    rows = torch.tensor([0] * (k + 1) + [1], device=tables.device)
    lens = torch.tensor([c + 1 + j for j in range(k + 1)] + [9], dtype=torch.int32, device=tables.device)
    q = randn(k + 2, 4, 64, dtype=dtype, device=device, seed=5)
    inputs = (q, k_cache, v_cache, tables.index_select(0, rows).contiguous(), lens)
    check_triton(inputs, dtype)
    scale = 64**-0.5
    torch.testing.assert_close(paged_attention_decode_triton(*inputs, scale),
                               paged_attention_sdpa_naive(*inputs, scale), **tolerances(dtype))
