import pytest
import torch

from native_engine.kernels.fused_gemv import fused_gemv_ref, fused_gemv_triton
from tests.native_engine.kernels.helpers import DTYPES, on_gpu_only_if, randn

PROLOGUES = ["plain", "norm", "silu_mul"]


def _inputs(prologue: str, m: int, n: int, k: int, dtype, device, residual: bool):
    x = randn(m, 2 * k if prologue == "silu_mul" else k, dtype=dtype, device=device, seed=1)
    w = randn(n, k, dtype=dtype, device=device, seed=2) / k**0.5
    kwargs = {"silu_mul": prologue == "silu_mul", "eps": 1e-6}
    if prologue == "norm":
        kwargs["norm"] = (1 + 0.1 * randn(k, device=device, seed=3)).to(dtype)
    if residual:
        kwargs["residual"] = randn(m, n, dtype=dtype, device=device, seed=4)
    return x, w, kwargs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prologue", PROLOGUES)
@pytest.mark.parametrize("residual", [False, True], ids=["", "residual"])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 70, 300), (3, 33, 1000), (1, 2100, 96)])
def test_fused_gemv_equals_the_unfused_ops(device, dtype, prologue, residual, m, n, k):
    on_gpu_only_if(device, dtype == torch.bfloat16 and m == 1)
    x, w, kwargs = _inputs(prologue, m, n, k, dtype, device, residual)
    got = fused_gemv_triton(x, w, **kwargs)
    expected = fused_gemv_ref(x.float(), w.float(), **{key: v.float() if torch.is_tensor(v) else v
                                                      for key, v in kwargs.items()})
    assert got.shape == (m, n) and got.dtype == dtype
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 2e-2}
    torch.testing.assert_close(got.float(), expected, **tol)


def test_the_reference_rounds_each_op_as_the_unfused_path_does():
    """In bf16 the reference must equal the separate ops: norm, SiLU-and-mul (computed in float32, as its
    Triton kernel does), linear and add, each stored."""
    from native_engine.kernels.fused_add_rms_norm import rms_norm_ref
    from native_engine.kernels.silu_and_mul import silu_and_mul_ref

    x, w, kwargs = _inputs("norm", 2, 40, 64, torch.bfloat16, "cpu", residual=True)
    unfused = torch.nn.functional.linear(rms_norm_ref(x, kwargs["norm"], 1e-6), w)
    unfused = (unfused.float() + kwargs["residual"].float()).to(torch.bfloat16)
    assert torch.equal(fused_gemv_ref(x, w, **kwargs), unfused)
    gu, w2, _ = _inputs("silu_mul", 2, 40, 64, torch.bfloat16, "cpu", residual=False)
    unfused = torch.nn.functional.linear(silu_and_mul_ref(gu.float()).to(torch.bfloat16), w2)
    assert torch.equal(fused_gemv_ref(gu, w2, silu_mul=True), unfused)


def test_more_rows_than_the_kernel_serves_are_refused(device):
    x, w, kwargs = _inputs("plain", 5, 8, 16, torch.float32, device, residual=False)
    with pytest.raises(AssertionError):
        fused_gemv_triton(x, w, **kwargs)
