"""Lazy weights read only a tensor-parallel rank's slice, and the slice is what the whole tensor holds there.

Files quantized by llama.cpp itself (Q4_1 and Q8_0 kept as blocks or dequantized, Q4_K with 256-weight
super-blocks), a llama model so the Q/K rows are un-interleaved per head on the slice, and the
safetensors directory of the same weights.
"""

from __future__ import annotations

import pytest
import torch

from native_engine.loader import Q4Blocks, load_gguf
from native_engine.loader.gguf_loader import Q8Blocks
from native_engine.loader.hf_loader import load_hf
from native_engine.loader.lazy import GGUFWeight, lazy_gguf, lazy_hf, materialize, narrow

from .conftest import QUANT_SPEC

llama_cpp = pytest.importorskip("llama_cpp")
LLAMA = QUANT_SPEC.with_(name="tiny-quant-llama", arch="llama", qkv_bias=False, tie_embeddings=False)
HEAD_DIM = LLAMA.hidden_size // LLAMA.num_heads  # 64


@pytest.fixture(scope="module")
def quantized(build, tmp_path_factory):
    from .test_quantized import _quantize

    out = tmp_path_factory.mktemp("lazy")
    return {ftype: _quantize(build(LLAMA), out / f"{ftype}.gguf", ftype) for ftype in ("Q4_1", "Q8_0", "Q4_K_M")}


def dense(x) -> torch.Tensor:
    return x.dequantize() if isinstance(x, (Q4Blocks, Q8Blocks)) else x


def same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return all(torch.equal(x, y) for x, y in zip(vars_of(a), vars_of(b), strict=True))


def vars_of(blocks) -> list[torch.Tensor]:
    return [getattr(blocks, f) for f in blocks.__slots__]


@pytest.mark.parametrize("ftype", ["Q4_1", "Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("keep", [True, False], ids=["blocks", "dequantized"])
def test_row_slices_equal_the_whole_tensors_rows(quantized, ftype, keep):
    _, whole = load_gguf(quantized[ftype], torch.float32, keep_q4_1=keep)
    _, lazy = lazy_gguf(quantized[ftype], torch.float32, keep_q4_1=keep)
    lazy = dict(lazy)
    for name, tensor in whole:
        weight = lazy[name]
        assert tuple(weight.shape) == tuple(tensor.shape)
        assert same(weight.load(), tensor), name
        rows = tensor.shape[0]
        start, size = (HEAD_DIM, rows - HEAD_DIM) if rows % HEAD_DIM == 0 and rows > HEAD_DIM else (1, rows - 1)
        assert same(weight.narrow(0, start, size), narrow(tensor, 0, start, size)), name  # q/k: whole heads


@pytest.mark.parametrize("ftype", ["Q4_1", "Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("start, size", [(128, 128), (64, 128), (0, 96)],
                         ids=["half", "cuts-a-256-block", "first-3-blocks"])
def test_column_slices_keep_whole_blocks_or_dequantize(quantized, ftype, start, size):
    _, whole = load_gguf(quantized[ftype], torch.float32, keep_q4_1=True)
    _, lazy = lazy_gguf(quantized[ftype], torch.float32, keep_q4_1=True)
    lazy = dict(lazy)
    name = "model.layers.0.mlp.down_proj.weight"  # [256, 512]: the row-parallel shard of an MLP
    tensor = dict(whole)[name]
    got = lazy[name].narrow(1, start, size)
    assert torch.equal(dense(got), dense(tensor)[:, start : start + size])
    if ftype in ("Q4_1", "Q8_0"):  # 32-weight blocks: every cut here is on a block boundary
        assert isinstance(got, (Q4Blocks, Q8Blocks)) and same(got, tensor.narrow(1, start, size))


def test_a_slice_reads_only_its_rows(quantized):
    """Each slice of the memory-mapped file is a fresh tensor of just that size."""
    _, lazy = lazy_gguf(quantized["Q4_K_M"], torch.float32)
    weight = dict(lazy)["model.layers.0.mlp.gate_proj.weight"]
    assert isinstance(weight, GGUFWeight) and tuple(weight.shape) == (512, 256)
    part = weight.narrow(0, 256, 128)
    assert part.shape == (128, 256) and part.untyped_storage().nbytes() == 128 * 256 * 4


def test_safetensors_slices(build):
    path = build(LLAMA, "hf")
    _, whole = load_hf(path)
    _, lazy = lazy_hf(path)
    lazy = dict(lazy)
    for name, tensor in whole:
        assert torch.equal(materialize(lazy[name]), tensor)
        assert torch.equal(lazy[name].narrow(0, 1, tensor.shape[0] - 1), tensor[1:])
        if tensor.dim() == 2:
            assert torch.equal(lazy[name].narrow(1, 32, 64), tensor[:, 32:96])


def test_narrow_of_the_whole_is_the_tensor_itself():
    t = torch.ones(4, 3)
    assert narrow(t, 0, 0, 4) is t and narrow(t, 1, 1, 2).shape == (4, 2)
