"""Compile each kernel for sm_90 without a GPU. Run as a script with TRITON_INTERPRET unset; exit 77: cannot here."""

import importlib
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def module(name: str):  # the package re-exports functions under the same names as these modules
    return importlib.import_module(f"native_engine.kernels.{name}")


INT_PTRS = {"block_tables_ptr": "*i32", "context_lens_ptr": "*i32", "query_start_ptr": "*i64", "seq_lens_ptr": "*i64", "slot_mapping_ptr": "*i64", "positions_ptr": "*i64",
            "seen_ptr": "*i1", "counts_ptr": "*i32", "ids_ptr": "*i64", "top_k_ptr": "*i64", "out_ptr": "*i64"}
FP32_ARGS = {"part_out_ptr": "*fp32", "part_ml_ptr": "*fp32", "cos_sin_ptr": "*fp32", "scale": "fp32", "eps": "fp32",
             "logits_ptr": "*fp32", "rep_ptr": "*fp32", "pres_ptr": "*fp32", "freq_ptr": "*fp32", "values_ptr": "*fp32",
             "q_ptr": "*fp32", "temp_ptr": "*fp32", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32", "tiny": "fp32"}
PAGED = {"BLOCK_G": 16, "BLOCK_N": 64, "BLOCK_D": 128, "DOT_PRECISION": "tf32", "DOT_FP32": False}
KERNELS = [
    (module("paged_attention")._paged_attention_kernel, {**PAGED, "IS_SPLIT": False}),
    (module("paged_attention")._paged_attention_kernel, {**PAGED, "IS_SPLIT": True}),
    (module("paged_attention")._reduce_kernel, {"BLOCK_S": 8, "BLOCK_D": 128}),
    (module("reshape_and_cache")._reshape_and_cache_kernel, {"BLOCK_H": 2, "BLOCK_D": 128}),
    (module("fused_add_rms_norm")._fused_add_rms_norm_kernel, {"HAS_RESIDUAL": True, "BLOCK": 1024}),
    (module("silu_and_mul")._silu_and_mul_kernel, {"BLOCK": 1024}),
    (module("rotary_embedding")._rotary_embedding_kernel,
     {"IS_NEOX": True, "BLOCK_H": 16, "BLOCK_KV": 2, "BLOCK_HALF": 64}),
    (module("qkv_rope_cache")._qkv_rope_cache_kernel,
     {"HAS_BIAS": True, "IS_NEOX": True, "BLOCK_H": 16, "BLOCK_KV": 2, "BLOCK_HALF": 32}),
    (module("qkv_rope_cache")._qkv_rope_cache_kernel,
     {"HAS_BIAS": False, "IS_NEOX": False, "BLOCK_H": 32, "BLOCK_KV": 4, "BLOCK_HALF": 64}),
    (module("gemv")._gemv_kernel, {"ATOMIC": False, "BLOCK_N": 32, "BLOCK_K": 256}),
    (module("gemv")._gemv_kernel, {"ATOMIC": True, "BLOCK_N": 16, "BLOCK_K": 512}),
    (module("fused_gemv")._fused_gemv_kernel,
     {"NORM": True, "SILU_MUL": False, "RESIDUAL": False, "BLOCK_N": 4, "BLOCK_K": 512}),
    (module("fused_gemv")._fused_gemv_kernel,
     {"NORM": False, "SILU_MUL": True, "RESIDUAL": True, "BLOCK_N": 8, "BLOCK_K": 512}),
    (module("fused_gemv")._fused_gemv_kernel,
     {"NORM": False, "SILU_MUL": False, "RESIDUAL": True, "BLOCK_N": 4, "BLOCK_K": 512}),
    (module("unified_attention")._unified_attention_kernel,
     {"BLOCK_Q": 9, "BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_D": 64, "DOT_PRECISION": "tf32", "DOT_FP32": False}),
    (module("unified_attention")._unified_attention_kernel,
     {"BLOCK_Q": 2, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_D": 128, "DOT_PRECISION": "tf32", "DOT_FP32": False}),
    (module("sampling")._penalties_kernel, {"HAS_REP": True, "HAS_COUNTS": True, "BLOCK": 2048}),
    (module("sampling")._penalties_kernel, {"HAS_REP": True, "HAS_COUNTS": False, "BLOCK": 2048}),
    (module("sampling")._candidates_kernel, {"HAS_TOP_K": True, "HAS_TOP_P": True, "HAS_MIN_P": True, "BLOCK_K": 64}),
    (module("sampling")._candidates_kernel, {"HAS_TOP_K": False, "HAS_TOP_P": True, "HAS_MIN_P": False, "BLOCK_K": 16}),
]


def signature(kernel, constexprs: dict) -> dict:
    sampling = kernel.fn.__module__.endswith(".sampling") if hasattr(kernel, "fn") else False
    sig = {}
    for name in kernel.arg_names:
        default = "*bf16" if name.endswith("_ptr") else "i32"
        ints = INT_PTRS if sampling or name != "out_ptr" else {}
        sig[name] = "constexpr" if name in constexprs else ints.get(name, FP32_ARGS.get(name, default))
    return sig


def main() -> None:
    if "nvidia" not in triton.backends.backends:
        sys.exit(77)
    for kernel, constexprs in KERNELS:
        src = ASTSource(fn=kernel, signature=signature(kernel, constexprs), constexprs=constexprs)
        triton.compile(src, target=GPUTarget("cuda", 90, 32))


if __name__ == "__main__":
    main()
