"""The C kernels of the float32 CPU path (`kernels/cpu_kernels.c`) against their torch references."""

import pytest
import torch

from native_engine.kernels import cpu_kernels
from native_engine.kernels.fused_add_rms_norm import fused_add_rms_norm_ref
from native_engine.kernels.paged_attention import paged_attention_decode_ref
from tests.native_engine.kernels.test_paged_attention import CONTEXT_LENS, make_inputs

pytestmark = pytest.mark.skipif(cpu_kernels.library() is None, reason="no C compiler: the torch path is used")


def blocks(n: int, k: int, q8: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(n, k // 32, generator=g) / 50
    if q8:
        return torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g), d, None
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    return cpu_kernels.pack_q4_1(q), d, torch.randn(n, k // 32, generator=g) / 50


@pytest.mark.parametrize("q8", [False, True])
@pytest.mark.parametrize("tokens", [0, 1, 3, 4, 9, 13, 40])
def test_blocks_matmul_matches_the_dequantized_product(q8, tokens):
    qs, d, m = blocks(968, 576, q8)
    x = torch.randn(tokens, 576, generator=torch.Generator().manual_seed(1))
    ref = cpu_kernels.blocks_matmul_ref(x.double(), qs, d.double(), None if m is None else m.double())
    out = cpu_kernels.blocks_matmul(x, qs, d, m)
    assert out.shape == (tokens, 968) and out.dtype == torch.float32
    # 1-3 tokens: activations as int16 per group of 32 (error <= 1.5e-5 of the group max |x|); else f32 (register
    # tiles of 8 and 4 tokens; from BLAS_ROWS tokens on dequantized rows and BLAS)
    tol = 5e-5 if tokens < 4 else 1e-6
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=tol * max(float(ref.abs().amax()) if tokens else 1.0, 1.0))


def test_pack_q4_1_is_the_gguf_byte_order():
    q = torch.arange(32, dtype=torch.uint8).remainder(16).view(1, 32)  # weights 0..15, 0..15
    assert cpu_kernels.pack_q4_1(q).tolist() == [[j | (j << 4) for j in range(16)]]


@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm(with_residual):
    g = torch.Generator().manual_seed(0)
    x, residual, weight = (torch.randn(5, 576, generator=g) for _ in range(3))
    out, res_out = cpu_kernels.add_rms_norm(x, residual if with_residual else None, weight[0], 1e-5)
    ref, ref_res = fused_add_rms_norm_ref(x, residual if with_residual else None, weight[0], 1e-5)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(res_out, ref_res)


@pytest.mark.parametrize("block_size", [4, 16])
def test_paged_attention_decode(block_size):
    query, k_cache, v_cache, tables, lens = make_inputs(CONTEXT_LENS, 9, 3, 64, torch.float32, "cpu", block_size)
    out = cpu_kernels.paged_attention_decode(query, k_cache, v_cache, tables, lens, 0.125)
    ref = paged_attention_decode_ref(query, k_cache, v_cache, tables, lens, 0.125)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_rotary_neox_in_place_on_strided_rows():
    from native_engine.kernels.rotary_embedding import rotary_embedding_ref
    from native_engine.layers.rotary_embedding import compute_cos_sin_cache

    cache = compute_cos_sin_cache(64, 128, 10000.0, None, torch.float32)
    qkv = torch.randn(6, (9 + 6) * 64, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([0, 1, 5, 17, 100, 127])
    expected = [t.clone() for t in rotary_embedding_ref(positions, qkv[:, :576].clone(), qkv[:, 576:768].clone(),
                                                        64, cache)]
    q, k = cpu_kernels.rotary_neox(positions, qkv[:, :576], qkv[:, 576:768], 64, cache)
    torch.testing.assert_close(qkv[:, :576], expected[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(qkv[:, 576:768], expected[1], rtol=1e-6, atol=1e-6)
    assert q.data_ptr() == qkv.data_ptr()


def test_cache_write_skips_padding_slots():
    from native_engine.kernels.reshape_and_cache import reshape_and_cache_ref

    kv = torch.randn(4, 2 * 3 * 64).view(4, 2, 3, 64)
    key, value = kv[:, 0], kv[:, 1]  # token rows strided, as split from qkv
    slots = torch.tensor([5, -1, 0, 31])
    caches = [torch.zeros(4, 8, 3, 64) for _ in range(4)]
    cpu_kernels.cache_write(key, value, caches[0], caches[1], slots)
    reshape_and_cache_ref(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_silu_and_mul():
    from native_engine.kernels.silu_and_mul import silu_and_mul_ref

    x = torch.randn(3, 2 * 1536) * 4
    torch.testing.assert_close(cpu_kernels.silu_and_mul(x), silu_and_mul_ref(x), rtol=1e-6, atol=1e-6)
