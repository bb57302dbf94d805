"""The batched C kernels (`kernels/cpu_batch.c`: tiled int16 matmuls, grouped decode attention) against torch."""

import pytest
import torch

from native_engine.kernels import cpu_batch, cpu_kernels
from native_engine.kernels.paged_attention import paged_attention_decode_ref
from native_engine.layers.quant import BlockWeight
from tests.native_engine.kernels.test_cpu_kernels import blocks
from tests.native_engine.kernels.test_paged_attention import CONTEXT_LENS, make_inputs

pytestmark = pytest.mark.skipif(cpu_batch.library() is None, reason="a plain-C build (no AVX2 or AVX-512 tier): the float32 kernels are used")


@pytest.mark.parametrize("q8", [False, True])
@pytest.mark.parametrize("tokens", [4, 5, 9, 14, 77])
def test_tiled_matmul_matches_the_dequantized_product(q8, tokens):
    qs, d, m = blocks(976, 1536 if tokens == 9 else 576, q8)
    x = torch.randn(tokens, qs.shape[1] * (1 if q8 else 2), generator=torch.Generator().manual_seed(1))
    x[0, :32] *= 1e-3  # a quiet group keeps its own scale
    ref = cpu_kernels.blocks_matmul_ref(x.double(), qs, d.double(), None if m is None else m.double())
    out = cpu_batch.TiledBlocks.build(qs, d, m).matmul(x)
    assert out.shape == ref.shape and out.dtype == torch.float32
    # activations as int16 per row and group of 32: error <= 1.5e-5 of the group's largest |x| per product
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=5e-5 * float(ref.abs().amax()))


def test_block_weights_take_the_tiles_from_four_rows_on():
    qs, d, m = blocks(64, 576, False)
    weight = BlockWeight.with_tiles(qs, d, m)
    assert weight.tiled is not None and weight.nbytes == 2 * (qs.numel() + d.numel() * 8)
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(weight.matmul(x), weight.tiled.matmul(x), rtol=0, atol=0)
    assert BlockWeight.with_tiles(*blocks(968, 576, False)).tiled is None  # rows not a multiple of 16


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(9, 3), (7, 1), (10, 2), (16, 2), (5, 5)])  # query heads per KV head 3, 7, 5, 8, 1
def test_paged_attention_batch(block_size, head_dim, heads):
    query, k_cache, v_cache, tables, lens = make_inputs(CONTEXT_LENS + [70], *heads, head_dim, torch.float32, "cpu",
                                                        block_size)
    out = cpu_batch.paged_attention_batch(query, k_cache, v_cache, tables, lens, 0.125)
    ref = paged_attention_decode_ref(query, k_cache, v_cache, tables, lens, 0.125)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_attention_batch_serves_head_dims_64_and_128_with_groups_up_to_8():
    assert cpu_batch.serves_attention(9, 3, 64) and cpu_batch.serves_attention(16, 2, 128)
    assert not cpu_batch.serves_attention(9, 3, 80) and not cpu_batch.serves_attention(32, 2, 64)


@pytest.mark.parametrize("tokens", [4, 37])
def test_silu_and_mul_rows(tokens):
    from native_engine.kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref

    x = torch.randn(tokens, 2 * 1536, generator=torch.Generator().manual_seed(3)) * 8  # both tails of the sigmoid
    x[0, :4] = torch.tensor([0.0, -100.0, 100.0, -1e-30])
    assert cpu_batch.serves_silu_and_mul(x)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), rtol=1e-6, atol=1e-6)
