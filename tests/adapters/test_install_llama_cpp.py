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


def _records_in(tmp_path, monkeypatch):
    from adapters.engines.llamacpp import markers

    monkeypatch.setattr(markers, "package_dir", lambda: tmp_path)
    return markers


def test_an_install_that_answers_only_with_the_preload_records_it_and_succeeds(monkeypatch, capsys, tmp_path):
    installer = _installer()
    markers = _records_in(tmp_path, monkeypatch)
    lib = installer.shared_libstdcxx()
    built = []
    monkeypatch.setattr(installer, "smoke", lambda env=None: (True, "ok") if (env or {}).get("LD_PRELOAD") == lib
                        else (False, "killed by SIGSEGV"))
    monkeypatch.setattr(installer, "cmake_args", lambda flags: None)
    monkeypatch.setattr(installer, "install", lambda version, args: built.append(args))  # no real build here
    assert installer.main([]) == 0
    out = capsys.readouterr().out
    assert built and f"LD_PRELOAD={lib}" in out and "recorded" in out
    assert (tmp_path / ".infer-ld-preload").read_text().strip() == lib and markers.preload_library() == lib
    assert markers.preload_env({"LD_PRELOAD": "/x.so"})["LD_PRELOAD"] == f"{lib} /x.so"

    monkeypatch.setattr(installer, "smoke", lambda env=None: (True, "ok"))  # a later build answers on its own
    assert installer.main([]) == 0
    assert not (tmp_path / ".infer-ld-preload").exists() and markers.preload_library() is None
    assert "preload is removed" in capsys.readouterr().out


def test_llama_cpp_runners_start_with_the_recorded_preload(monkeypatch, tmp_path):
    import asyncio

    from adapters.engines.runner.client import Launch, RunnerClient

    lib = _installer().shared_libstdcxx()
    _records_in(tmp_path, monkeypatch)
    (tmp_path / ".infer-ld-preload").write_text(lib + "\n")
    assert Launch.single("native").env.get("LD_PRELOAD") == os.environ.get("LD_PRELOAD")  # only llama.cpp's runners

    async def environ_of_a_runner() -> dict[str, str]:
        runner = RunnerClient(Launch.single("llamacpp"), hang_timeout=30)
        try:
            raw = Path(f"/proc/{runner.pid}/environ").read_bytes()
        finally:
            await runner.stop(grace=10)
        return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)

    assert asyncio.run(environ_of_a_runner())["LD_PRELOAD"].split()[0] == lib
