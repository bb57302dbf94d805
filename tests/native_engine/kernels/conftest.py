"""Triton launchers run on CPU tensors through TRITON_INTERPRET, and natively on CUDA when there is a GPU."""

import os

import pytest
import torch

from tests.native_engine.kernels.helpers import interpreted

if not torch.cuda.is_available():  # must happen before triton and the kernel modules are imported
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    """Device for the Triton launcher tests; skips when it cannot run there."""
    pytest.importorskip("triton")
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if request.param == "cpu" and not interpreted():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set (or a GPU is present)")
    return request.param
