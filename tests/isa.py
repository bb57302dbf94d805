"""The CPU tiers this machine can run the native engine at, for the ISA matrix (tests/native_engine/test_isa_matrix.py
and tests/realmodel/test_isa_matrix.py): the C kernels' `-march` (INFER_CPU_MARCH) and PyTorch's kernels
(ATEN_CPU_CAPABILITY). A machine with AVX-512 runs every tier; one with AVX2 the two below it; another
architecture its native build only. Each tier runs in a child process (PyTorch reads its variable at import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from native_engine.kernels import cpu_kernels

ROOT = Path(__file__).resolve().parents[1]


def marches() -> list[str]:
    """INFER_CPU_MARCH values below and at this CPU's own."""
    return cpu_kernels.runnable_marches()


def capabilities() -> list[str]:
    """ATEN_CPU_CAPABILITY values this CPU can run."""
    return cpu_kernels.runnable_capabilities()


def child_env(march: str, capability: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "INFER_CPU_MARCH": march, "ATEN_CPU_CAPABILITY": capability, **extra}


def run_pytest(paths: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                           "--timeout", str(timeout), *paths], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
