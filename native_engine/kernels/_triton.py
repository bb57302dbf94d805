"""Optional triton import: kernels are defined either way, but only launched when triton imports.

Triton is imported only where it can launch or is wanted: with CUDA, under ``TRITON_INTERPRET=1``
(CPU tests), or when the process has imported it already (ahead-of-time compiles). On a CPU-only
machine its import (~0.1 s) would only slow the model's load."""

import os
import sys
from types import SimpleNamespace

import torch

try:
    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1" or "triton" in sys.modules):
        raise ImportError("no CUDA device and not interpreting: the torch references run")
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the CPU path never launches a kernel
    HAS_TRITON = False
    triton = SimpleNamespace(
        jit=lambda fn=None, **_: fn if fn is not None else (lambda f: f),
        cdiv=lambda a, b: -(-a // b),
        next_power_of_2=lambda n: 1 << max(n - 1, 0).bit_length(),
    )
    tl = SimpleNamespace(constexpr=int)

__all__ = ["HAS_TRITON", "assert_last_dim_contiguous", "tl", "triton", "triton_available", "use_triton"]


def triton_available() -> bool:
    return HAS_TRITON


def use_triton(x: torch.Tensor) -> bool:
    return HAS_TRITON and x.is_cuda


def assert_last_dim_contiguous(*tensors: torch.Tensor) -> None:
    for t in tensors:
        assert t.stride(-1) == 1, f"last dim must be contiguous, got strides {t.stride()}"
