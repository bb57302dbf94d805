"""Triton launchers run on CPU tensors through TRITON_INTERPRET, and natively on CUDA when there is a GPU."""

import importlib
import os

import pytest
import torch

if not torch.cuda.is_available():  # must happen before triton and the kernel modules are imported
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _interpreted() -> bool:
    # triton decorates its own tl.* helpers and our kernels once, at import, according to TRITON_INTERPRET
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    kernel = importlib.import_module("native_engine.kernels.silu_and_mul")._silu_and_mul_kernel
    return isinstance(standard.sigmoid, InterpretedFunction) and isinstance(kernel, InterpretedFunction)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    """Device for the Triton launcher tests; skips when it cannot run there."""
    pytest.importorskip("triton")
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if request.param == "cpu" and not _interpreted():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set (or a GPU is present)")
    return request.param
