"""Matmuls of float32 activations with weights kept as GGUF Q4_1 / Q8_0 blocks, on CPU.

`cpu_kernels.c` dequantizes each block in registers and multiplies in float32 (AVX-512 when the
compiler targets it), so the result is the dense float32 product up to summation order, while only
the blocks are read: 0.56 byte per Q4_1 weight, 1.06 per Q8_0 one. Decode steps of a few rows run
the whole model in one call of `cpu_decode.c` (see models/cpu_decode.py). Both files are compiled once with the
system C compiler (`cc -O3 -march=native -fopenmp`, well under a second; `INFER_CPU_MARCH` sets another
`-march`, e.g. `x86-64-v3` for the AVX2 tier or `x86-64` for plain C, and is part of the cache key) into
`<infer cache>/kernels/` and loaded with ctypes; its OpenMP calls land in the runtime torch already
loaded (same soname), so no second thread pool spins. When no compiler is there or the build
fails, `library()` is None and callers keep PyTorch's int4 kernel (`layers/quant.py`).

`blocks_matmul_ref` is the torch reference the tests compare against.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

SOURCES = tuple(Path(__file__).with_name(name) for name in ("cpu_kernels.c", "cpu_decode.c", "cpu_batch.c"))
HEADERS = (Path(__file__).with_name("cpu_step.h"),)  # part of the build's key, not of the command line
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-Werror=implicit-function-declaration")
MARCH_ENV = "INFER_CPU_MARCH"  # the kernels' -march: native (default), or a lower tier (x86-64-v3, x86-64) to test or pin
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
BLAS_ROWS = 32  # from this many activation rows on, dequantize once and let BLAS multiply
_local = threading.local()
log = logging.getLogger(__name__)


def kernel_dir() -> Path:
    """`kernels/` under infer's cache: `$INFER_CACHE_DIR`, else `$XDG_CACHE_HOME/infer`, else `~/.cache/infer`.

    The rule of `registry.realmodels.cache_dir`, written here because the engine imports nothing from
    the project; `tests/test_import_boundary.py` checks that the two agree."""
    if explicit := os.environ.get("INFER_CACHE_DIR"):
        return Path(explicit) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "infer" / "kernels"


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels (built on first use, then cached on disk), or None without a compiler."""
    if os.environ.get("INFER_NO_CPU_KERNELS") or platform.system() != "Linux":
        return None
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return None
    try:
        source = b"".join(p.read_bytes() for p in (*SOURCES, *HEADERS))
    except OSError:  # an install without the kernel sources
        return None
    flags = (*FLAGS, f"-march={march()}")
    key = hashlib.sha256(source + " ".join((compiler, *flags, _cpu_flags())).encode()).hexdigest()[:16]
    path = kernel_dir() / f"cpu_kernels-{key}.so"
    try:
        if not path.exists():
            _build(compiler, flags, path)
        lib = ctypes.CDLL(str(path))
    except subprocess.CalledProcessError as exc:  # said once: a silent fallback hid a broken build before
        why = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
        log.warning("the CPU kernels did not build with %s (%s): %s; using PyTorch's kernels", compiler,
                    " ".join(flags), why[-1] if why else f"exit status {exc.returncode}")
        return None
    except OSError as exc:
        log.warning("the CPU kernels did not load (%s); using PyTorch's kernels", exc)
        return None
    lib.q4_1_matmul.argtypes = (_P, _I64, _I64, _P, _P, _P, _I64, _P, _INT)
    lib.q8_0_matmul.argtypes = (_P, _I64, _I64, _P, _P, _I64, _P, _INT)
    lib.add_rms_norm.argtypes = (_P, _P, _P, ctypes.c_float, _I64, _I64, _P, _P)
    lib.paged_attention_decode.argtypes = (_P, _P, _P, _P, _P, ctypes.c_float, *(_I64,) * 6, _P, _INT)
    lib.rotary_neox.argtypes = (_P, *(_I64,) * 4, _P, _P)
    lib.cache_write.argtypes = (_P, _P, *(_I64,) * 4, _P, _P, _P)
    lib.silu_and_mul.argtypes = (_P, _I64, _I64, _P)
    lib.llama_decode.argtypes = (_I64, _I64, _P, _P, _P, _P, _P, *(_I64,) * 6, ctypes.c_float, _P, _I64, _P, _P,
                                 ctypes.c_float, _INT)
    lib.llama_decode_rows.argtypes = (_I64, _I64, _P, _P, _P, _P, _P, *(_I64,) * 6, ctypes.c_float, _P, _I64, _P, _P,
                                      ctypes.c_float, _P, _P, _I64, _P, _P, _INT)
    lib.dequantize_blocks.argtypes = (_P, _P, _P, _I64, _I64, _P, _INT)
    lib.simd_tier.restype = _INT
    lib.decode_rows_matmul.argtypes = (_P, _I64, _I64, _P, _P, _P, _I64, _P)
    lib.decode_rows_matmul.restype = None
    for fn in (lib.dequantize_blocks, lib.llama_decode, lib.llama_decode_rows, lib.q4_1_matmul, lib.q8_0_matmul, lib.add_rms_norm, lib.paged_attention_decode, lib.rotary_neox,
               lib.cache_write, lib.silu_and_mul):
        fn.restype = None
    return lib


def march() -> str:
    """The `-march` the kernels are built for: `$INFER_CPU_MARCH`, else `native` (this CPU's every extension)."""
    return os.environ.get(MARCH_ENV) or "native"


def tier() -> str:
    """Which SIMD path the built library runs: "avx512" (AVX512-VNNI), "avx2" (AVX2 + FMA + F16C) or "scalar";
    None without a library."""
    lib = library()
    return None if lib is None else ("scalar", "avx2", "avx512")[lib.simd_tier()]


def runnable_marches() -> list[str]:
    """The INFER_CPU_MARCH values this CPU runs, lowest first: x86-64 and x86-64-v3 (with AVX2, FMA, F16C, BMI2)
    below `native`; on other architectures `native` alone."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ["native"]
    v3 = {"avx2", "fma", "f16c", "bmi2"} <= set(_cpu_flags().split())
    return ["x86-64", *(["x86-64-v3"] if v3 else []), "native"]


def runnable_capabilities() -> list[str]:
    """The ATEN_CPU_CAPABILITY values (PyTorch's CPU kernels) this CPU runs, lowest first."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ["default"]
    flags = set(_cpu_flags().split())
    return ["default", *(["avx2"] if "avx2" in flags else []), *(["avx512"] if "avx512f" in flags else [])]


def cpu_flags() -> set[str]:
    """The CPU's flags as /proc/cpuinfo lists them (none where it has no flags line)."""
    line = _cpu_flags()
    return set(line.split(":", 1)[1].split()) if ":" in line else set()


def _cpu_flags() -> str:
    try:
        return next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return platform.machine()


def _build(compiler: str, flags: tuple[str, ...], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # built aside, renamed into place: atomic
        out = Path(tmp) / path.name
        subprocess.run([compiler, *flags, *map(str, SOURCES), "-o", str(out)], check=True, capture_output=True, timeout=120)
        os.replace(out, path)


def blocks_matmul(x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    """x [T, K] float32 @ blocks [N, K].T -> [T, N] float32. qs: [N, K / 2] uint8 packed Q4_1 nibbles
    (`pack_q4_1`) with m given, or [N, K] int8 Q8_0 values with m None; d, m: [N, K / 32] float32."""
    lib = library()
    assert lib is not None, "no C compiler: use the torch path"
    x = x.contiguous()
    num_tokens, k = x.shape
    n = qs.shape[0]
    out = torch.empty(num_tokens, n, dtype=torch.float32)
    if num_tokens == 0:
        return out
    threads = torch.get_num_threads()
    if num_tokens >= BLAS_ROWS:  # compute-bound: dequantize into a reused buffer, then BLAS (same f32 maths)
        w = _scratch(n * k)[: n * k].view(n, k)
        lib.dequantize_blocks(qs.data_ptr(), d.data_ptr(), None if m is None else m.data_ptr(), n, k, w.data_ptr(),
                              threads)
        return torch.mm(x, w.t(), out=out)
    if m is None:
        lib.q8_0_matmul(x.data_ptr(), num_tokens, k, qs.data_ptr(), d.data_ptr(), n, out.data_ptr(), threads)
    else:
        lib.q4_1_matmul(x.data_ptr(), num_tokens, k, qs.data_ptr(), d.data_ptr(), m.data_ptr(), n, out.data_ptr(),
                        threads)
    return out


def serves(*tensors: torch.Tensor) -> bool:
    """The C kernels take these: float32 CPU tensors and a compiled library."""
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors) and library() is not None


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) * weight, x + residual); x, residual: [T, H] float32."""
    x = x.contiguous()
    out = torch.empty_like(x)
    if residual is None:
        library().add_rms_norm(x.data_ptr(), None, weight.data_ptr(), eps, x.shape[0], x.shape[1], out.data_ptr(),
                               None)
        return out, x
    residual_out = torch.empty_like(x)
    library().add_rms_norm(x.data_ptr(), residual.contiguous().data_ptr(), weight.data_ptr(), eps, x.shape[0],
                           x.shape[1], out.data_ptr(), residual_out.data_ptr())
    return out, residual_out


def paged_attention_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """query [B, nh, D]; caches [num_blocks, block_size, nkv, D]; int32 tables [B, W] and lengths [B]."""
    head_dim, block_size = query.shape[2], k_cache.shape[1]
    assert head_dim <= 256 and block_size <= 256
    return paged_attention_call(library().paged_attention_decode, query, k_cache, v_cache, block_tables,
                                context_lens, scale)


def paged_attention_call(kernel, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """``kernel`` (a paged decode attention of the library, one signature) on these tensors: contiguous query,
    int32 tables and lengths, a new output."""
    (batch, num_heads, head_dim), (block_size, num_kv_heads) = query.shape, k_cache.shape[1:3]
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    query, tables = query.contiguous(), block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    out = torch.empty_like(query)
    kernel(query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), lens.data_ptr(), scale, batch,
           num_heads, num_kv_heads, head_dim, block_size, tables.shape[1], out.data_ptr(), torch.get_num_threads())
    return out


def rotary_neox(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, head_dim: int,
                cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """In place on query [T, nh * D] and key [T, nkv * D] (rows may be strided, as split from qkv)."""
    positions = positions.to(torch.int64).contiguous()
    for x in (query, key):
        assert x.stride(1) == 1, x.stride()
        library().rotary_neox(x.data_ptr(), x.shape[0], x.stride(0), x.shape[1] // head_dim, head_dim,
                              positions.data_ptr(), cos_sin_cache.data_ptr())
    return query, key


def cache_write(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                slot_mapping: torch.Tensor) -> None:
    """key, value [T, nkv, D] (token rows may be strided) into caches [num_blocks, block_size, nkv, D]."""
    assert key.stride(1) == key.shape[2] and key.stride(2) == 1 and value.stride()[1:] == key.stride()[1:]
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    slots = slot_mapping.to(torch.int64).contiguous()
    library().cache_write(key.data_ptr(), value.data_ptr(), key.shape[0], key.stride(0), value.stride(0),
                          key.shape[1] * key.shape[2], slots.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr())


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # x [T, 2 * I] -> [T, I]
    x = x.contiguous()
    out = x.new_empty(x.shape[0], x.shape[1] // 2)
    library().silu_and_mul(x.data_ptr(), x.shape[0], out.shape[1], out.data_ptr())
    return out


def _scratch(numel: int) -> torch.Tensor:
    """A float32 buffer of at least `numel` elements, one per thread (engines run in their own threads)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.numel() < numel:
        buf = _local.buf = torch.empty(numel)
    return buf


def pack_q4_1(q: torch.Tensor) -> torch.Tensor:
    """q: [N, K] values 0..15 -> [N, K / 2] uint8 in GGUF order (byte j of a block: weight j low, j + 16 high)."""
    n, k = q.shape
    halves = q.to(torch.uint8).view(n, k // 32, 2, 16)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(n, k // 2)


def blocks_matmul_ref(x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    n = qs.shape[0]
    if m is None:
        w = qs.to(d.dtype).view(n, -1, 32) * d[..., None]
    else:
        packed = qs.view(n, -1, 16)
        q = torch.cat([packed & 15, packed >> 4], dim=-1)  # [N, groups, 32]
        w = q.to(d.dtype) * d[..., None] + m[..., None]
    return x.to(d.dtype) @ w.view(n, -1).t()


def decode_rows_matmul(x: torch.Tensor, qs: torch.Tensor, d16: torch.Tensor, m16: torch.Tensor | None) -> torch.Tensor:
    """x [T, K] @ blocks [N, K].T through `llama_decode_rows`' matmul rows (float16 scales d16, m16 [N, K / 32];
    m16 None: Q8_0): the decode step's arithmetic, called alone by the load-time check."""
    x = x.contiguous()
    out = torch.empty(x.shape[0], qs.shape[0], dtype=torch.float32)
    library().decode_rows_matmul(x.data_ptr(), x.shape[0], x.shape[1], qs.data_ptr(), d16.data_ptr(),
                                 None if m16 is None else m16.data_ptr(), qs.shape[0], out.data_ptr())
    return out
