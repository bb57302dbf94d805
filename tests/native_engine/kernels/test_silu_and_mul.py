import pytest
import torch

from native_engine.kernels.silu_and_mul import (
    silu_and_mul,
    silu_and_mul_ref,
    silu_and_mul_triton,
)
from tests.native_engine.kernels.helpers import DTYPES, randn, tolerances


def silu_and_mul_naive(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[1] // 2
    rows = [(a / (1 + torch.exp(-a))) * b for a, b in ((row[:half].double(), row[half:].double()) for row in x)]
    return torch.stack(rows).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_tokens", "inter_size"), [(1, 1), (3, 80), (2, 1100)])
def test_triton_matches_reference(device, dtype, num_tokens, inter_size):
    x = randn(num_tokens, 2 * inter_size, dtype=dtype, device=device)
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_ref(x), **tolerances(dtype))


def test_triton_strided_rows_and_empty(device):
    x = randn(4, 3 * 64, device=device)[:, :128]  # row stride 192
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_ref(x))
    assert silu_and_mul_triton(x[:0]).shape == (0, 64)


def test_triton_asserts_layout():
    pytest.importorskip("triton")
    with pytest.raises(AssertionError):
        silu_and_mul_triton(torch.randn(2, 7))
    with pytest.raises(AssertionError, match="contiguous"):
        silu_and_mul_triton(torch.randn(8, 2).t())


@pytest.mark.parametrize("dtype", DTYPES[:2])
def test_reference_matches_naive(dtype):
    x = randn(5, 2 * 48, dtype=dtype)
    torch.testing.assert_close(silu_and_mul_ref(x), silu_and_mul_naive(x), **tolerances(dtype))


def test_dispatcher_matches_reference_on_cpu():  # the C kernel (f32) or the reference
    x = randn(3, 16)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), rtol=1e-6, atol=1e-6)
