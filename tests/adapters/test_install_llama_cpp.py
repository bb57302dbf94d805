"""scripts/install_llama_cpp.py when the smoke test keeps crashing: it names the shared libstdc++ that makes
llama.cpp answer, when preloading it does (a lent GPU box's builds crashed at load without it)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _installer():
    spec = importlib.util.spec_from_file_location("install_llama_cpp", ROOT / "scripts" / "install_llama_cpp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shared_libstdcxx_is_found_on_this_machine():
    lib = _installer().shared_libstdcxx()
    assert lib is not None and os.path.exists(lib) and "libstdc++" in lib


def test_a_crash_that_preloading_fixes_is_reported_with_the_variable_to_set(monkeypatch, capsys):
    installer = _installer()
    lib = installer.shared_libstdcxx()
    seen = []

    def smoke(env=None):  # crashes unless the C++ runtime is preloaded, as on the GPU box
        seen.append((env or {}).get("LD_PRELOAD"))
        return (True, "ok: 4 tokens") if seen[-1] == lib else (False, "killed by SIGSEGV")

    monkeypatch.setattr(installer, "smoke", smoke)
    monkeypatch.setattr(installer, "cmake_args", lambda flags: None)  # a CPU pip's build is kept for
    assert installer.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "FAILS (killed by SIGSEGV)" in out and f"LD_PRELOAD={lib}" in out and seen == [None, lib]


def test_a_crash_that_preloading_does_not_fix_gets_no_hint(monkeypatch, capsys):
    installer = _installer()
    monkeypatch.setattr(installer, "smoke", lambda env=None: (False, "killed by SIGSEGV"))
    monkeypatch.setattr(installer, "cmake_args", lambda flags: None)
    assert installer.main(["--check"]) == 1
    assert "LD_PRELOAD" not in capsys.readouterr().out
