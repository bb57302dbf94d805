import pytest
import torch

from native_engine.kernels.fused_add_rms_norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
    fused_add_rms_norm_triton,
    rms_norm,
    rms_norm_ref,
    rms_norm_triton,
)
from tests.native_engine.kernels.helpers import DTYPES, randn, tolerances

EPS = 1e-6


def rms_norm_naive(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # HF LlamaRMSNorm, per token
    rows = []
    for row in x.double():
        rows.append(row * torch.rsqrt(row.pow(2).mean() + eps) * weight.double())
    return torch.stack(rows).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden_size", [64, 80, 1000])
@pytest.mark.parametrize("with_residual", [True, False])
def test_triton_matches_reference(device, dtype, hidden_size, with_residual):
    x = randn(3, hidden_size, dtype=dtype, device=device)
    residual = randn(3, hidden_size, dtype=dtype, device=device, seed=1) if with_residual else None
    weight = randn(hidden_size, dtype=dtype, device=device, seed=2)
    out, residual_out = fused_add_rms_norm_triton(x, residual, weight, EPS)
    ref_out, ref_residual = fused_add_rms_norm_ref(x, residual, weight, EPS)
    torch.testing.assert_close(out, ref_out, **tolerances(dtype))
    torch.testing.assert_close(residual_out, ref_residual, **tolerances(dtype))  # interpreter rounds bf16 to zero
    torch.testing.assert_close(rms_norm_triton(x, weight, EPS), rms_norm_ref(x, weight, EPS), **tolerances(dtype))


def test_triton_strided_rows_and_fp32_weight(device):
    x = randn(4, 96, dtype=torch.bfloat16, device=device)[:, :64]
    residual = randn(4, 64, dtype=torch.bfloat16, device=device, seed=1)
    weight = randn(64, device=device, seed=2)
    out, residual_out = fused_add_rms_norm_triton(x, residual, weight, EPS)
    ref_out, ref_residual = fused_add_rms_norm_ref(x, residual, weight, EPS)
    torch.testing.assert_close(out, ref_out, **tolerances(torch.bfloat16))
    torch.testing.assert_close(residual_out, ref_residual, **tolerances(torch.bfloat16))
    assert fused_add_rms_norm_triton(x[:0], residual[:0], weight, EPS)[0].shape == (0, 64)


def test_triton_asserts_shapes():
    pytest.importorskip("triton")
    with pytest.raises(AssertionError, match="weight"):
        fused_add_rms_norm_triton(torch.randn(2, 8), None, torch.randn(7), EPS)
    with pytest.raises(AssertionError):
        fused_add_rms_norm_triton(torch.randn(2, 8), torch.randn(3, 8), torch.randn(8), EPS)


@pytest.mark.parametrize("dtype", DTYPES[:2])
def test_reference_matches_naive(dtype):
    x, residual, weight = randn(5, 80, dtype=dtype), randn(5, 80, dtype=dtype, seed=1), randn(80, dtype=dtype, seed=2)
    out, residual_out = fused_add_rms_norm_ref(x, residual, weight, EPS)
    torch.testing.assert_close(residual_out, x + residual)
    torch.testing.assert_close(out, rms_norm_naive(x + residual, weight, EPS), **tolerances(dtype))


def test_reference_without_residual_returns_input():
    x, weight = randn(2, 16), randn(16, seed=1)
    out, residual_out = fused_add_rms_norm_ref(x, None, weight, EPS)
    assert residual_out is x
    torch.testing.assert_close(out, rms_norm_naive(x, weight, EPS))


def test_dispatchers_match_reference_on_cpu():  # the C kernel (f32) or the reference
    x, residual, weight = randn(3, 32), randn(3, 32, seed=1), randn(32, seed=2)
    torch.testing.assert_close(rms_norm(x, weight, EPS), rms_norm_ref(x, weight, EPS), rtol=1e-6, atol=1e-6)
    got, want = fused_add_rms_norm(x, residual, weight, EPS), fused_add_rms_norm_ref(x, residual, weight, EPS)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
