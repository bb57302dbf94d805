"""Files quantized by llama.cpp itself dequantize close to the original f32 weights."""

from __future__ import annotations

import ctypes

import gguf
import pytest
import torch

from native_engine.loader import load_gguf
from native_engine.loader.gguf_loader import SUPPORTED_TYPES
from registry.modelbuilder.gguf_out import gguf_name
from registry.modelbuilder.weights import iter_tensors

from .conftest import QUANT_SPEC

llama_cpp = pytest.importorskip("llama_cpp")
Q = gguf.GGMLQuantizationType

# Worst relative (Frobenius) error per stored type; measured ~0.6x these on N(0, 1/in) weights.
MAX_REL_ERROR = {
    Q.F32: 0.0, Q.Q8_0: 0.01, Q.Q6_K: 0.03, Q.Q5_0: 0.07, Q.Q5_1: 0.07, Q.Q5_K: 0.06,
    Q.Q4_0: 0.13, Q.Q4_1: 0.12, Q.Q4_K: 0.11, Q.Q3_K: 0.23, Q.Q2_K: 0.45,
}  # fmt: skip
# llama.cpp file type -> the type it must use for most matrices (others may fall back, e.g. Q6_K output).
FTYPES = {
    "Q8_0": Q.Q8_0, "Q4_0": Q.Q4_0, "Q4_1": Q.Q4_1, "Q5_0": Q.Q5_0, "Q5_1": Q.Q5_1,
    "Q2_K": Q.Q2_K, "Q3_K_M": Q.Q3_K, "Q4_K_M": Q.Q4_K, "Q5_K_M": Q.Q5_K, "Q6_K": Q.Q6_K,
}  # fmt: skip
LLAMA_SPEC = QUANT_SPEC.with_(name="tiny-quant-llama", arch="llama", qkv_bias=False, tie_embeddings=False)


@pytest.fixture(scope="module")
def qwen2_files(build, tmp_path_factory):
    out = tmp_path_factory.mktemp("quantized")
    return {ftype: _quantize(build(QUANT_SPEC), out / f"{ftype}.gguf", ftype) for ftype in FTYPES}


def _quantize(src, dst, ftype: str):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0
    return dst


def _check(path, spec):
    stored = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert set(stored.values()) <= SUPPORTED_TYPES
    reference = dict(iter_tensors(spec, 0))
    _, tensors = load_gguf(path)
    loaded = dict(tensors)
    assert loaded.keys() == reference.keys()
    for name, tensor in loaded.items():
        expected = torch.from_numpy(reference[name])
        assert tensor.shape == expected.shape
        error = ((tensor - expected).norm() / expected.norm()).item()
        assert error <= MAX_REL_ERROR[stored[gguf_name(name)]], (name, stored[gguf_name(name)].name, error)
    return set(stored.values())


@pytest.mark.parametrize("ftype", FTYPES)
def test_llama_cpp_quantized_qwen2(qwen2_files, ftype):
    assert FTYPES[ftype] in _check(qwen2_files[ftype], QUANT_SPEC)


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M", "Q5_K_M"])
def test_llama_cpp_quantized_llama_unpermutes_qk(build, tmp_path, ftype):
    # a wrong Q/K row order would give a relative error of ~1.4, far above every bound
    types = _check(_quantize(build(LLAMA_SPEC), tmp_path / f"{ftype}.gguf", ftype), LLAMA_SPEC)
    assert FTYPES[ftype] in types


def test_required_types_are_covered(qwen2_files):
    present = {t.tensor_type for path in qwen2_files.values() for t in gguf.GGUFReader(path).tensors}
    assert {Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K} <= present
