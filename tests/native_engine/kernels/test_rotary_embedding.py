import pytest
import torch

from native_engine.kernels.rotary_embedding import (
    rotary_embedding,
    rotary_embedding_ref,
    rotary_embedding_triton,
)
from tests.native_engine.kernels.helpers import DTYPES, randn, tolerances

MAX_POS = 64


def cos_sin_cache(head_dim: int, base: float = 10000.0, device: str = "cpu") -> torch.Tensor:  # [MAX_POS, D]
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    freqs = torch.outer(torch.arange(MAX_POS, dtype=torch.float64), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).float().to(device)


def rotate_half(x: torch.Tensor) -> torch.Tensor:  # HF transformers
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotary_hf_naive(positions, x, head_dim, base=10000.0):  # HF Llama: per token, emb = cat(freqs, freqs)
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    rows = []
    for pos, row in zip(positions.tolist(), x.double().view(x.shape[0], -1, head_dim)):
        emb = torch.cat((pos * inv_freq, pos * inv_freq))
        rows.append(row * emb.cos() + rotate_half(row) * emb.sin())
    return torch.stack(rows).view(x.shape).to(x.dtype)


def rotary_gptj_naive(positions, x, head_dim, base=10000.0):  # interleaved pairs (x[2i], x[2i+1])
    out = x.double().view(x.shape[0], -1, head_dim).clone()
    for t, pos in enumerate(positions.tolist()):
        for i in range(head_dim // 2):
            angle = torch.tensor(pos / base ** (2 * i / head_dim), dtype=torch.float64)
            a, b = out[t, :, 2 * i].clone(), out[t, :, 2 * i + 1].clone()
            out[t, :, 2 * i] = a * angle.cos() - b * angle.sin()
            out[t, :, 2 * i + 1] = b * angle.cos() + a * angle.sin()
    return out.view(x.shape).to(x.dtype)


def make_qk(num_tokens, num_heads, num_kv_heads, head_dim, dtype, device):  # q, k as views of one qkv tensor
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, device=device)
    q, k, _ = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    return q, k


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (4, 2), (14, 2)])
@pytest.mark.parametrize("is_neox", [True, False])
def test_triton_matches_reference(device, dtype, head_dim, num_heads, num_kv_heads, is_neox):
    positions = torch.tensor([0, 1, 17, MAX_POS - 1, 5], device=device)
    q, k = make_qk(5, num_heads, num_kv_heads, head_dim, dtype, device)
    cache = cos_sin_cache(head_dim, device=device)
    ref_q, ref_k = rotary_embedding_ref(positions, q.clone(), k.clone(), head_dim, cache, is_neox)
    out_q, out_k = rotary_embedding_triton(positions, q, k, head_dim, cache, is_neox)
    assert out_q is q and out_k is k
    torch.testing.assert_close(out_q, ref_q, **tolerances(dtype))
    torch.testing.assert_close(out_k, ref_k, **tolerances(dtype))


def test_triton_empty_batch(device):
    q, k = make_qk(0, 2, 1, 64, torch.float32, device)
    positions = torch.zeros(0, dtype=torch.int64, device=device)
    assert rotary_embedding_triton(positions, q, k, 64, cos_sin_cache(64, device=device))[0].shape == (0, 128)


def test_triton_asserts_cache_width():
    pytest.importorskip("triton")
    q, k = make_qk(2, 2, 1, 64, torch.float32, "cpu")
    with pytest.raises(AssertionError, match="cos_sin_cache"):
        rotary_embedding_triton(torch.tensor([0, 1]), q, k, 64, cos_sin_cache(32))


@pytest.mark.parametrize("dtype", DTYPES[:2])
@pytest.mark.parametrize("head_dim", [64, 80])
def test_reference_matches_hf_rotate_half(dtype, head_dim):
    positions = torch.tensor([3, 0, 63, 9])
    q, k = make_qk(4, 3, 1, head_dim, dtype, "cpu")
    want_q, want_k = rotary_hf_naive(positions, q, head_dim), rotary_hf_naive(positions, k, head_dim)
    got_q, got_k = rotary_embedding_ref(positions, q, k, head_dim, cos_sin_cache(head_dim))
    assert got_q is q and got_k is k  # in place, like the Triton launcher
    torch.testing.assert_close(got_q, want_q, **tolerances(dtype))
    torch.testing.assert_close(got_k, want_k, **tolerances(dtype))


def test_reference_matches_gptj_interleaved():
    positions = torch.tensor([7, 2])
    q, k = make_qk(2, 2, 1, 16, torch.float32, "cpu")
    want_q, want_k = rotary_gptj_naive(positions, q, 16), rotary_gptj_naive(positions, k, 16)
    got_q, got_k = rotary_embedding_ref(positions, q, k, 16, cos_sin_cache(16), is_neox=False)
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(got_k, want_k)


def test_dispatcher_matches_reference_on_cpu():  # the C kernel (f32) or the reference
    positions = torch.tensor([1, 4])
    q, k = make_qk(2, 2, 2, 32, torch.float32, "cpu")
    want = rotary_embedding_ref(positions, q.clone(), k.clone(), 32, cos_sin_cache(32))
    got = rotary_embedding(positions, q, k, 32, cos_sin_cache(32))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
