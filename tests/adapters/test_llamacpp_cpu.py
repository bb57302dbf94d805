"""llama.cpp on this CPU (issue 27): the build flags chosen from /proc/cpuinfo, over recorded samples
(Sapphire Rapids with AMX, Cascade Lake with AVX-512 and no AMX, Haswell with AVX2 only), and quantized
models answering a prompt of several tokens, in a child process so that a crash (the AMX segfault of a
``GGML_NATIVE`` build) fails the test instead of killing pytest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from adapters.engines.llamacpp.cpu_build import build_warning, cmake_args, cpu_flags, explicit_args, has_amx, wheel_key

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "cpuinfo"


def flags_of(name: str) -> set[str]:
    return cpu_flags((SAMPLES / f"{name}.txt").read_text())


def options(args: list[str]) -> dict[str, str]:
    return dict(arg.removeprefix("-D").split("=") for arg in args)


def test_sapphire_rapids_gets_a_portable_build_of_its_extensions_with_amx_off():
    flags = flags_of("sapphire_rapids")
    assert has_amx(flags)
    got = options(cmake_args(flags))
    assert got["GGML_NATIVE"] == "OFF"
    assert all(got[o] == "ON" for o in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_AVX512",
                                        "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX512_VBMI", "GGML_AVX_VNNI"))
    assert got["GGML_AMX_TILE"] == got["GGML_AMX_INT8"] == got["GGML_AMX_BF16"] == "OFF"


def test_avx512_without_amx_keeps_pips_build_and_its_explicit_build_has_no_bf16():
    flags = flags_of("cascade_lake")
    assert not has_amx(flags) and cmake_args(flags) is None
    got = options(explicit_args(flags))
    assert got["GGML_AVX512"] == got["GGML_AVX512_VNNI"] == "ON"
    assert got["GGML_AVX512_BF16"] == got["GGML_AVX_VNNI"] == "OFF"


def test_avx2_only_never_gets_avx512():
    flags = flags_of("haswell")
    assert cmake_args(flags) is None
    got = options(explicit_args(flags))
    assert got["GGML_AVX2"] == got["GGML_FMA"] == got["GGML_F16C"] == "ON"
    assert got["GGML_AVX512"] == got["GGML_AVX512_VNNI"] == got["GGML_AVX512_BF16"] == "OFF"


def test_a_flag_counts_only_when_every_processor_has_it():
    text = "flags\t: avx avx2 amx_int8\n\nflags\t: avx avx2\n"
    assert cpu_flags(text) == {"avx", "avx2"} and not has_amx(cpu_flags(text))


def test_the_wheel_cache_key_follows_the_flags_not_the_machine():
    spr, clx = explicit_args(flags_of("sapphire_rapids")), explicit_args(flags_of("cascade_lake"))
    assert wheel_key("0.3.36", spr) == wheel_key("0.3.36", list(spr))
    assert len({wheel_key("0.3.36", spr), wheel_key("0.3.36", clx), wheel_key("0.3.37", spr)}) == 3


def test_a_runner_warns_about_pips_build_only_on_an_amx_cpu():
    spr = (SAMPLES / "sapphire_rapids.txt").read_text()
    assert "segfaults on quantized models" in build_warning(spr, None)
    assert build_warning(spr, " ".join(cmake_args(cpu_flags(spr)))) is None
    assert build_warning((SAMPLES / "cascade_lake.txt").read_text(), None) is None


def test_this_machine_reports_its_amx():
    """What the install step sees here (this project's CI machine has no AMX: its crash cannot be seen here)."""
    flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    assert has_amx(flags) == ("amx_int8" in Path("/proc/cpuinfo").read_text())


def run_child(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adapters.engines.llamacpp.smoke", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("dtype", ["q4_0", "q8_0"])
def test_a_quantized_model_answers_a_prompt_of_several_tokens(tmp_path, dtype):
    from adapters.engines.llamacpp.smoke import tiny_quantized

    model = tiny_quantized(tmp_path, dtype)
    done = run_child(str(model))
    assert done.returncode == 0, f"llama.cpp died ({done.returncode}): {done.stderr[-2000:]}"
    assert done.stdout.startswith("ok: 4 tokens")


@pytest.mark.realmodel
def test_smollm2_q4_1_answers_a_prompt_of_several_tokens():
    """The model of the AMX report (fetched once into ~/.cache/infer, as the realmodel tests do)."""
    from registry.realmodels import FetchError, fetch_smollm2

    try:
        path = fetch_smollm2()
    except (FetchError, OSError) as exc:
        pytest.skip(f"SmolLM2-135M-Instruct Q4_1 cannot be fetched: {exc}")
    done = run_child(str(path))
    assert done.returncode == 0, f"llama.cpp died ({done.returncode}): {done.stderr[-2000:]}"
