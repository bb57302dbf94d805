"""Which llama.cpp build this CPU can run: the flag logic behind ``scripts/install_llama_cpp.py``.

llama-cpp-python ships as a source package; pip builds it with llama.cpp's default ``GGML_NATIVE=ON``
(``-march=native``). On a Xeon with AMX (Sapphire Rapids and later) that build segfaults on any
Q4/Q8 model with a prompt of more than one token (llama-cpp-python 0.3.36; the AMX matmul path), so
there the install builds it again with ``GGML_NATIVE=OFF``, every ISA extension the CPU has named
explicitly, and the AMX ones off. Such a build runs on this CPU and on any CPU with the same
extensions; it is cached under a key made of the version and those flags (:func:`wheel_key`), never
in pip's own wheel cache, whose key (the source package's URL) knows nothing of the flags and would
hand a build made for one CPU to another.

Pure functions over the text of ``/proc/cpuinfo``; tested over recorded samples.
"""

from __future__ import annotations

import hashlib

# /proc/cpuinfo flag -> llama.cpp's CMake option (ggml/CMakeLists.txt), in build order.
ISA_OPTIONS = (
    ("sse4_2", "GGML_SSE42"),
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("bmi2", "GGML_BMI2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("avx_vnni", "GGML_AVX_VNNI"),
    ("avx512f", "GGML_AVX512"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
)
AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")
AMX_OPTIONS = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")


def cpu_flags(cpuinfo: str) -> set[str]:
    """The flags every processor of ``/proc/cpuinfo`` reports (their intersection: a build must run on all)."""
    per_cpu = [set(line.split(":", 1)[1].split()) for line in cpuinfo.splitlines()
               if line.split(":", 1)[0].strip() == "flags" and ":" in line]
    return set.intersection(*per_cpu) if per_cpu else set()


# x86-64 micro-architecture levels as /proc/cpuinfo flags: a build of one runs on every CPU of that level
# (GCC's -march=x86-64-v3 and -march=x86-64), whatever extensions the building machine has beyond it.
TIER_FLAGS = {
    "x86-64-v3": {"sse4_2", "avx", "avx2", "bmi2", "fma", "f16c"},
    "x86-64": set(),
}


def has_amx(flags: set[str]) -> bool:
    return any(flag in flags for flag in AMX_FLAGS)


def explicit_args(flags: set[str]) -> list[str]:
    """CMake arguments for a portable build of exactly this CPU's extensions, AMX off."""
    args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{option}={'ON' if flag in flags else 'OFF'}" for flag, option in ISA_OPTIONS]
    args += [f"-D{option}=OFF" for option in AMX_OPTIONS]
    return args


def cmake_args(flags: set[str]) -> list[str] | None:
    """The CMake arguments llama-cpp-python must be built with here; None: pip's default build is fine."""
    return explicit_args(flags) if has_amx(flags) else None


def wheel_key(version: str, args: list[str]) -> str:
    """The cache key of a build: the version and a digest of its flags (never the machine's name)."""
    return f"{version}-{hashlib.sha256(' '.join(args).encode()).hexdigest()[:16]}"


def build_warning(cpuinfo: str, installed_args: str | None) -> str | None:
    """What a llama.cpp runner logs at start when this CPU has AMX and the installed build is pip's default."""
    if not has_amx(cpu_flags(cpuinfo)) or installed_args:
        return None
    return ("this CPU has AMX and llama-cpp-python is pip's default build (GGML_NATIVE), which segfaults on "
            "quantized models; rebuild it for this CPU: `python scripts/install_llama_cpp.py` (make install does)")

