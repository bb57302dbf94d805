import os
import subprocess
import sys

import pytest
import torch

from native_engine import kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

WITHOUT_TRITON = """
import sys
sys.modules["triton"] = None  # import triton -> ImportError
import torch
from native_engine.kernels import paged_attention_decode, rms_norm, silu_and_mul, triton_available
assert not triton_available()
assert silu_and_mul(torch.ones(1, 4)).shape == (1, 2)
assert rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6).shape == (2, 8)
"""


def run_python(code_or_path: list[str], **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    return subprocess.run([sys.executable, *code_or_path], cwd=ROOT, env=full_env, capture_output=True, text=True, check=False)


def test_exports():
    assert sorted(kernels.__all__) == [
        "fused_add_rms_norm", "paged_attention_decode", "qkv_rope_cache", "reshape_and_cache", "rms_norm",
        "rotary_embedding", "silu_and_mul", "triton_available", "unified_attention",
    ]
    assert all(callable(getattr(kernels, name)) for name in kernels.__all__)


def test_triton_available_matches_import():
    try:
        import triton  # noqa: F401
    except ImportError:
        assert not kernels.triton_available()
    else:
        assert kernels.triton_available()


def test_package_works_without_triton():
    result = run_python(["-c", WITHOUT_TRITON])
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    pytest.importorskip("triton")
    script = os.path.join(os.path.dirname(__file__), "compile_for_gpu.py")
    result = run_python([script], TRITON_DEFAULT_FP_FUSION="1", PYTHONPATH=ROOT)
    if result.returncode == 77:
        pytest.skip("triton has no CUDA backend here")
    assert result.returncode == 0, result.stderr[-3000:]


def test_dispatch_on_cpu_never_needs_triton():
    x = torch.randn(2, 6)
    assert torch.equal(kernels.silu_and_mul(x), torch.nn.functional.silu(x[:, :3]) * x[:, 3:])
