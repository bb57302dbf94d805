import importlib

import pytest
import torch

DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
]


def tolerances(dtype: torch.dtype) -> dict:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


def randn(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def on_gpu_only_if(device: str, keep: bool) -> None:
    """Every case runs in the interpreter; on a GPU only the kept ones, so the GPU run compiles a few kernels
    (each compile costs the device time of a short check) instead of every combination."""
    if device == "cuda" and not keep:
        pytest.skip("interpreter only: a representative subset runs on the GPU")


def interpreted() -> bool:
    """Whether the Triton kernels run on CPU tensors here: triton decorates its own tl.* helpers and our kernels
    once, at import, according to TRITON_INTERPRET (set before triton was imported, and no GPU)."""
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    kernel = importlib.import_module("native_engine.kernels.silu_and_mul")._silu_and_mul_kernel
    return isinstance(standard.sigmoid, InterpretedFunction) and isinstance(kernel, InterpretedFunction)
