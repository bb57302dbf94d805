"""Triton kernels with torch references; each dispatcher runs Triton on CUDA tensors, the reference elsewhere."""

from native_engine.kernels._triton import triton_available
from native_engine.kernels.fused_add_rms_norm import fused_add_rms_norm, rms_norm
from native_engine.kernels.paged_attention import paged_attention_decode
from native_engine.kernels.qkv_rope_cache import qkv_rope_cache
from native_engine.kernels.reshape_and_cache import reshape_and_cache
from native_engine.kernels.rotary_embedding import rotary_embedding
from native_engine.kernels.silu_and_mul import silu_and_mul
from native_engine.kernels.unified_attention import unified_attention

__all__ = [
    "fused_add_rms_norm",
    "paged_attention_decode",
    "qkv_rope_cache",
    "reshape_and_cache",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "triton_available",
    "unified_attention",
]
