import pytest
import torch
import torch.nn.functional as F

from native_engine.kernels.gemv import gemv_triton
from tests.native_engine.kernels.helpers import DTYPES, on_gpu_only_if, randn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), [(70, 300), (128, 64), (33, 1000)])
@pytest.mark.parametrize(("block_n", "block_k", "split_k"), [(32, 256, 1), (16, 128, 3), (64, 64, 4)])
def test_gemv_equals_linear(device, dtype, n, k, block_n, block_k, split_k):
    on_gpu_only_if(device, dtype == torch.bfloat16 and n == 33 and block_n != 16)
    x, w = randn(1, k, dtype=dtype, device=device, seed=1), randn(n, k, dtype=dtype, device=device, seed=2)
    expected = F.linear(x.float(), w.float())
    got = gemv_triton(x, w, block_n, block_k, split_k)
    assert got.shape == (1, n) and got.dtype == dtype
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.15, "rtol": 2e-2}
    torch.testing.assert_close(got.float(), expected, **tol)
