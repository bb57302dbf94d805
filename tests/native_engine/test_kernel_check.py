"""The load-time kernel check (`layers/kernel_check.py`): every quantized matmul path available on this build
passes on this CPU, and a path that computes wrong (here: a nibble layout the kernel does not read, the fault
that made the engine answer garbage on AVX2 CPUs) is caught, logged once, and replaced by the next path down."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from gguf.quants import quantize

from native_engine.kernels import cpu_batch, cpu_kernels
from native_engine.layers import kernel_check
from native_engine.layers.linear import Linear
from native_engine.layers.quant import BlockWeight, Int4Weight
from native_engine.loader.gguf_loader import Q4Blocks

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_verdicts(monkeypatch):
    monkeypatch.setattr(kernel_check, "_verdicts", {})


def q4_1_blocks(rows: int = 128, cols: int = 256) -> Q4Blocks:
    """llama.cpp's Q4_1 blocks of a random matrix, as the GGUF loader hands them over."""
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0)).numpy() * 0.05
    raw = quantize(w, QType.Q4_1).reshape(rows, cols // 32, 20)
    d = torch.from_numpy(np.ascontiguousarray(raw[..., 0:2]).view(np.float16)[..., 0].astype(np.float32))
    m = torch.from_numpy(np.ascontiguousarray(raw[..., 2:4]).view(np.float16)[..., 0].astype(np.float32))
    packed = torch.from_numpy(np.ascontiguousarray(raw[..., 4:]))
    q = torch.cat([packed & 15, packed >> 4], dim=-1).reshape(rows, cols)
    return Q4Blocks(q, d, m)


def dense(blocks: Q4Blocks) -> torch.Tensor:
    return (blocks.q.double().view(blocks.q.shape[0], -1, 32) * blocks.d.double()[..., None]
            + blocks.m.double()[..., None]).view(blocks.q.shape)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_every_path_built_here_passes_on_this_cpu(fmt, caplog):
    q, d, m = kernel_check.sample_blocks(fmt)
    paths = ["torch-int4"] + (["blocks", "decode-rows"] if cpu_kernels.library() else [])
    paths += ["tiled"] if cpu_batch.library() else []
    with caplog.at_level(logging.WARNING, logger=kernel_check.__name__):
        assert {p: kernel_check.usable(p, q, d, m) for p in paths} == dict.fromkeys(paths, True)
    assert caplog.records == []


def linear_from(blocks: Q4Blocks) -> Linear:
    linear = Linear(blocks.q.shape[1], blocks.q.shape[0])
    linear.load_blocks(0, blocks)
    linear.finish_loading(int4=True)
    return linear


@pytest.mark.skipif(cpu_kernels.library() is None, reason="no C compiler: no C path to break")
def test_a_c_kernel_reading_the_wrong_layout_is_caught_and_replaced(monkeypatch, caplog):
    blocks = q4_1_blocks()
    assert isinstance(linear_from(blocks).int4, BlockWeight)  # the C kernels serve it when they are right
    monkeypatch.setattr(kernel_check, "_verdicts", {})
    swapped = cpu_kernels.pack_q4_1  # weights j and j + 16 trade nibbles: the kernel reads the wrong ones

    def wrong_layout(q):
        n, k = q.shape
        return swapped(q.view(n, k // 32, 2, 16).flip(2).reshape(n, k))

    monkeypatch.setattr(cpu_kernels, "pack_q4_1", wrong_layout)
    with caplog.at_level(logging.WARNING, logger=kernel_check.__name__):
        first, second = linear_from(blocks), linear_from(blocks)
    assert isinstance(first.int4, Int4Weight) and isinstance(second.int4, Int4Weight)  # PyTorch's int4 instead
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines  # once per path and format, not once per matrix
    assert lines[0].startswith("kernel check: blocks on q4_1 blocks fails on this CPU")
    assert "flags" in lines[0] and "PyTorch capability" in lines[0] and f"-march={cpu_kernels.march()}" in lines[0]
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
    ref = x.double() @ dense(blocks).t()
    assert ((first(x).double() - ref).norm() / ref.norm()) < 4e-3  # right, up to bf16 roundings


STALE_LAYOUT = """
import numpy as np, torch
from native_engine.layers import quant

def avx512_layout(q):  # what quant.pack_nibbles wrote before: the layout of PyTorch's AVX-512 kernel only
    out_features, in_features = q.shape
    v = q.to(torch.uint8).numpy().reshape(out_features // 64, 2, 32, in_features)
    pairs = v[:, 0] | (v[:, 1] << 4)
    return torch.from_numpy(np.ascontiguousarray(pairs.transpose(0, 2, 1)).reshape(out_features, in_features // 2))

quant.pack_nibbles = avx512_layout
"""


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_pytorch_int4_with_a_stale_layout_falls_back_to_float32(capability, tmp_path):
    """The bug of issue 38 itself: the AVX-512 kernel's nibble layout fed to PyTorch's AVX2 / scalar kernel."""
    script = STALE_LAYOUT + textwrap.dedent("""
        import logging, sys
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stdout)
        from tests.native_engine.test_kernel_check import dense, linear_from, q4_1_blocks
        blocks = q4_1_blocks()
        linear = linear_from(blocks)
        x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
        ref = x.double() @ dense(blocks).t()
        print("int4" if linear.int4 is not None else "dense", float((linear(x).double() - ref).norm() / ref.norm()))
    """)
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "INFER_NO_CPU_KERNELS": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("native_engine.layers.kernel_check: kernel check: torch-int4 on q4_1 blocks fails")
    assert f"PyTorch capability {capability.upper()}" in lines[0]
    kind, error = lines[1].split()
    assert kind == "dense" and float(error) < 1e-6  # the exact float32 path
