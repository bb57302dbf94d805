"""Int4 weight-only matmuls over GGUF 4- and 8-bit blocks: the blocks are recovered exactly from the
dequantized matrix, other matrices are refused, and the product is close to float32's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from gguf.quants import dequantize, quantize

from native_engine.layers.quant import pack_int4, pack_int8_as_int4


def gguf_roundtrip(weight: torch.Tensor, qtype: QType) -> torch.Tensor:
    """What the loader yields for a matrix stored in `qtype`: llama.cpp's blocks, dequantized to f32."""
    blocks = quantize(weight.numpy(), qtype)
    return torch.from_numpy(np.ascontiguousarray(dequantize(blocks, qtype))).reshape(weight.shape)


def dense(weights) -> torch.Tensor:
    """The matrix back through the kernel (x = identity), up to bf16 roundings inside the kernel."""
    eye = torch.eye(weights[0].packed.shape[1] * 2)
    return sum(w.matmul(eye) for w in weights).t()


def assert_same_up_to_bf16_rounding(ours: torch.Tensor, w: torch.Tensor) -> None:
    """bf16 scales and output: within 2^-6 of the row's largest weight (one wrong nibble is ~2^-4)."""
    assert ((ours - w).abs() <= w.abs().amax(1, keepdim=True) * 2**-6).all()


@pytest.fixture
def weight() -> torch.Tensor:
    return torch.randn(96, 128, generator=torch.Generator().manual_seed(0)) * 0.05


def test_q4_1_blocks_are_recovered_exactly(weight):
    w = gguf_roundtrip(weight, QType.Q4_1)
    packed = pack_int4(w)
    assert packed is not None
    assert_same_up_to_bf16_rounding(dense([packed]), w)


def test_q8_0_blocks_split_into_two_nibble_matrices_exactly(weight):
    w = gguf_roundtrip(weight, QType.Q8_0)
    assert pack_int4(w) is None
    halves = pack_int8_as_int4(w)
    assert halves is not None
    assert_same_up_to_bf16_rounding(dense(halves), w)


def test_matrices_that_are_not_blocks_stay_dense(weight):
    assert pack_int4(weight) is None and pack_int8_as_int4(weight) is None
    assert pack_int4(torch.zeros(4, 48)) is None  # columns not a multiple of 64


def test_product_is_close_to_float32(weight):
    w = gguf_roundtrip(weight, QType.Q4_1)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(1))
    ours, ref = pack_int4(w).matmul(x), x.double() @ w.double().t()
    assert ours.dtype == torch.float32 and ours.shape == (5, 96)
    assert ((ours.double() - ref).norm() / ref.norm()) < 4e-3  # bf16 activations, scales and output
