"""The ISA matrix: the kernel tests (default tier) and the engine's greedy-equality tests (slow tier) at every CPU
tier this machine can emulate. The C kernels built for x86-64 (plain C) and x86-64-v3 (AVX2 + FMA), and PyTorch's
int4 kernel at each capability below this CPU's (`default`, `avx2`), must each pass the tests the suite runs at the
native tier, which the suite itself runs (tests/isa.py lists the tiers; tests/realmodel/test_isa_matrix.py asks
SmolLM2 at every tier)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from native_engine.kernels import cpu_kernels
from tests import isa

C_KERNEL_TESTS = ["tests/native_engine/kernels/test_cpu_kernels.py", "tests/native_engine/kernels/test_cpu_batch.py",
                  "tests/native_engine/kernels/test_sgmv.py", "tests/native_engine/test_kernel_check.py"]
TORCH_INT4_TESTS = ["tests/native_engine/test_quant.py", "tests/native_engine/test_kernel_check.py"]  # no C kernels
# The engine: one C call per decode step against the module path, greedy tokens of the quantized paths against
# the exact ones (speculative decoding's tiers), LoRA adapters against their merged weights (the C step's and
# the tiled prefill's adapter rows among them), and `infer compare` of a Q8_0 file against its f32 original.
ENGINE_TESTS = ["tests/native_engine/engine/test_cpu_decode.py", "tests/native_engine/engine/test_speculative.py",
                "tests/native_engine/engine/test_lora.py", "tests/native_engine/engine/test_lora_rounding.py",
                "tests/native_engine/engine/test_bf16_prefill.py",
                "tests/accuracy/test_compare_cli.py::test_q8_0_against_f32_of_the_same_random_model"]
LOWER_MARCHES = [m for m in isa.marches() if m != "native"]
LOWER_CAPABILITIES = [c for c in isa.capabilities() if c != "avx512"]


def tiered(values: list[str], default_tier: str) -> list:
    """``values`` with all but ``default_tier`` (AVX2: most laptops, the tier that once answered garbage) in the
    slow tier; CI runs both."""
    return [v if v == default_tier else pytest.param(v, marks=pytest.mark.slow) for v in values]


def assert_passed(done) -> None:
    tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
    assert done.returncode == 0, "\n".join(tail)
    assert " passed" in tail[-1] and "failed" not in tail[-1], tail[-1]


@pytest.mark.parametrize("march", tiered(LOWER_MARCHES, "x86-64-v3"))
def test_c_kernels_at_a_lower_march(march):
    assert_passed(isa.run_pytest(C_KERNEL_TESTS, isa.child_env(march, "default")))


@pytest.mark.parametrize("capability", tiered(LOWER_CAPABILITIES, "avx2"))
def test_pytorch_int4_at_a_lower_capability(capability):
    assert_passed(isa.run_pytest(TORCH_INT4_TESTS, isa.child_env("native", capability, INFER_NO_CPU_KERNELS="1")))


@pytest.mark.slow
@pytest.mark.parametrize("march", LOWER_MARCHES)
def test_engine_at_a_lower_march(march):
    assert_passed(isa.run_pytest(ENGINE_TESTS, isa.child_env(march, "avx2" if march == "x86-64-v3" else "default"),
                                 timeout=900))


@pytest.mark.slow
@pytest.mark.parametrize("capability", LOWER_CAPABILITIES)
def test_engine_without_c_kernels_at_a_lower_capability(capability):
    env = isa.child_env("native", capability, INFER_NO_CPU_KERNELS="1")
    assert_passed(isa.run_pytest(ENGINE_TESTS, env, timeout=900))


EXPECTED_TIER = {"x86-64": "scalar", "x86-64-v3": "avx2"}


@pytest.mark.parametrize("march", LOWER_MARCHES)
def test_the_kernels_build_and_load_at_a_lower_march(march):
    """A build that does not load leaves the engine on PyTorch's kernels and the tests above skipping: so the
    library itself must load at each tier, with the SIMD path the tier promises."""
    done = subprocess.run([sys.executable, "-c", "from native_engine.kernels import cpu_kernels; print(cpu_kernels.tier())"],
                          cwd=isa.ROOT, env=isa.child_env(march, "default"), capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == EXPECTED_TIER[march], done.stderr


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None, reason="no aarch64 cross compiler (Debian's "
                    "gcc-aarch64-linux-gnu, which .ci/run installs)")
def test_the_kernels_build_for_arm_with_nothing_x86_left(tmp_path):
    """On aarch64 the kernels take their plain-C paths: they compile, and the library needs nothing but libc, libm
    and OpenMP (an x86 intrinsic left behind would be an undefined symbol, as _cvtsh_ss was on AVX2)."""
    out = tmp_path / "kernels.so"
    subprocess.run(["aarch64-linux-gnu-gcc", *cpu_kernels.FLAGS, "-march=armv8-a", *map(str, cpu_kernels.SOURCES),
                    "-o", str(out)], check=True, capture_output=True, timeout=300)
    listing = subprocess.run(["aarch64-linux-gnu-nm", "-D", "--undefined-only", str(out)], capture_output=True,
                             text=True, check=True).stdout
    names = {line.split()[1].split("@")[0] for line in listing.splitlines() if line.split()[:1] == ["U"]}
    allowed = {"GOMP_parallel", "omp_get_num_threads", "omp_get_thread_num", "abort", "aligned_alloc", "free", "malloc",
               "memcpy", "memset", "expf", "ldexpf", "lrintf", "sqrtf", "__tls_get_addr"}
    assert names <= allowed, names - allowed
