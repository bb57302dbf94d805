"""``make install``'s llama.cpp step: leave a llama-cpp-python that answers on this CPU.

1. Read the CPU's flags (/proc/cpuinfo). With AMX, pip's default build (``GGML_NATIVE=ON``) is known
   to segfault on quantized models, so go to 3.
2. Without AMX, run the smoke test (``python -m adapters.engines.llamacpp.smoke``: a Q4_0 model, a prompt
   of several tokens, in a child process). It answers: done. It crashes (a wheel built for another
   CPU, from a shared cache): go to 3 with this CPU's extensions.
3. Build llama-cpp-python (the installed version) with ``GGML_NATIVE=OFF``, this CPU's extensions
   named explicitly and AMX off (``adapters/engines/llamacpp/cpu_build.py``), into
   ``~/.cache/infer/llama-cpp-wheels/<version>-<digest of the flags>/``, bypassing pip's wheel cache
   (its key does not know the flags); install it, record the flags beside the package, smoke-test it.

When the smoke test still crashes, it is run once more with the system's shared libstdc++ preloaded
(``LD_PRELOAD``): on a lent GPU box (Ubuntu 24.04, GCC 13.3, a venv Python 3.12) every build of 0.3.36,
with or without AMX, AVX-512 or llamafile, segfaulted while loading any model (in ``print_info``, before
any compute) and answered with it preloaded; its libraries linked no shared libstdc++ (a C++ runtime linked
statically into each of them, e.g. from ``LDFLAGS``). When that is what answers, the script records the
library beside the package (``adapters/engines/llamacpp/markers.py``): the gateway starts its llama.cpp
runners with it preloaded and ``make test`` runs the suite so; a later smoke test that answers without it
removes the record.

Exit status 0 when llama.cpp answers (with the recorded preload, if it needs one), 1 otherwise (with the
reason). ``--check`` only reports.
"""

from __future__ import annotations

import argparse
import ctypes.util
import importlib.metadata
import os
import signal
import subprocess
import sys
from pathlib import Path

from adapters.engines.llamacpp import markers
from adapters.engines.llamacpp.cpu_build import TIER_FLAGS, cmake_args, cpu_flags, explicit_args, has_amx, wheel_key

PACKAGE = "llama-cpp-python"


def smoke(env: dict[str, str] | None = None) -> tuple[bool, str]:
    try:
        done = subprocess.run([sys.executable, "-m", "adapters.engines.llamacpp.smoke"], capture_output=True,
                              text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired:
        return False, "no answer in 600 s"
    if done.returncode == 0:
        return True, done.stdout.strip()
    if done.returncode < 0:
        return False, f"killed by {signal.Signals(-done.returncode).name}"
    return False, (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]


def shared_libstdcxx() -> str | None:
    """The system's shared libstdc++ (what ``gcc -print-file-name`` or the loader's cache knows), if any."""
    try:
        found = subprocess.run(["gcc", "-print-file-name=libstdc++.so.6"], capture_output=True, text=True,
                               timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        found = ""
    if found and Path(found).is_absolute() and Path(found).exists():
        return str(Path(found).resolve())
    name = ctypes.util.find_library("stdc++")
    return name if name and Path(name).is_absolute() else None


def answers_with_preload() -> str | None:
    """After a crash: the shared libstdc++ with which preloaded llama.cpp answers, if there is one."""
    lib = shared_libstdcxx()
    if lib is None:
        return None
    ok, _ = smoke({**os.environ, "LD_PRELOAD": lib})
    return lib if ok else None


def preload_hint(lib: str) -> str:
    return (f"llama.cpp answers with the shared libstdc++ preloaded: its libraries carry a static C++ runtime "
            f"(check LDFLAGS/CXXFLAGS for -static-libstdc++ and rebuild), or run with LD_PRELOAD={lib}")


def settle_failure(record: bool) -> bool:
    """The smoke test crashed: does preloading the shared libstdc++ make llama.cpp answer? Say so, and with
    ``record`` write it down for the runners and ``make test``. True when llama.cpp answers that way."""
    lib = answers_with_preload()
    if lib is None:
        if record:
            markers.write(markers.LD_PRELOAD, None)
        return False
    print(preload_hint(lib))
    if record:
        markers.write(markers.LD_PRELOAD, lib)
        print(f"recorded: infer's llama.cpp runners and `make test` preload {lib} "
              f"({markers.package_dir() / markers.LD_PRELOAD})")
    return True


def answered() -> None:
    """The smoke test answered without help: a preload recorded earlier is no longer needed."""
    if markers.read(markers.LD_PRELOAD) is not None:
        markers.write(markers.LD_PRELOAD, None)
        print("llama.cpp answers without a preloaded library: the recorded preload is removed")


def wheel_dir(version: str, args: list[str]) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "infer" / "llama-cpp-wheels" / wheel_key(version, args)


def build(version: str, args: list[str]) -> Path:
    """A wheel of ``version`` built with ``args`` (from the flag-keyed cache when it is there)."""
    out = wheel_dir(version, args)
    wheels = sorted(out.glob("llama_cpp_python-*.whl"))
    if wheels:
        return wheels[-1]
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CMAKE_ARGS": " ".join(args), "FORCE_CMAKE": "1"}
    print(f"building {PACKAGE} {version} with CMAKE_ARGS={env['CMAKE_ARGS']!r} (minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "--no-binary", PACKAGE,
                    f"{PACKAGE}=={version}", "-w", str(out)], env=env, check=True)
    return sorted(out.glob("llama_cpp_python-*.whl"))[-1]


def install(version: str, args: list[str]) -> None:
    wheel = build(version, args)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
                   check=True)
    markers.write(markers.CMAKE_ARGS, " ".join(args))


def install_tier(version: str, tier: str, target: Path) -> int:
    """llama-cpp-python built for one x86-64 level (``GGML_NATIVE=OFF``, that level's extensions only) into
    ``target`` (a folder put first on ``sys.path`` by ``bench/native.py --march``), beside the venv's own build."""
    args = explicit_args(TIER_FLAGS[tier])
    wheel = build(version, args)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", str(target),
                    str(wheel)], check=True)
    (target / "llama_cpp" / markers.CMAKE_ARGS).write_text(" ".join(args))
    print(f"llama.cpp {version} for {tier} in {target}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report, change nothing")
    parser.add_argument("--tier", choices=sorted(TIER_FLAGS), help="build for this x86-64 level into --target")
    parser.add_argument("--target", type=Path, help="with --tier: the folder to install into")
    options = parser.parse_args(argv)
    if options.tier:
        return install_tier(importlib.metadata.version(PACKAGE), options.tier,
                            options.target or Path(".bench") / f"llama-cpp-{options.tier}")
    flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    version = importlib.metadata.version(PACKAGE)
    args = cmake_args(flags)
    recorded = markers.read(markers.CMAKE_ARGS)
    installed = recorded.split() if recorded else None
    print(f"llama.cpp: {PACKAGE} {version}; this CPU {'has' if has_amx(flags) else 'has no'} AMX"
          + (f"; installed build: {' '.join(installed)}" if installed else "; installed build: pip's default"))
    if args is None or installed == args:
        ok, detail = smoke()
        print(f"llama.cpp smoke test: {'answers' if ok else 'FAILS'} ({detail})")
        if ok:
            if not options.check:
                answered()
            return 0
        if options.check:
            settle_failure(record=False)
            return 1
        args = explicit_args(flags)
    elif options.check:
        print("llama.cpp: this CPU needs a build without AMX; run `make install`")
        return 1
    install(version, args)
    ok, detail = smoke()
    print(f"llama.cpp smoke test after the rebuild: {'answers' if ok else 'FAILS'} ({detail})")
    if ok:
        answered()
        return 0
    return 0 if settle_failure(record=True) else 1


if __name__ == "__main__":
    sys.exit(main())
