"""What ``scripts/install_llama_cpp.py`` recorded beside the installed ``llama_cpp`` package, for those who
start llama.cpp later.

- ``.infer-cmake-args``: the CMake arguments of the build it made for this CPU (absent: pip's default build).
- ``.infer-ld-preload``: a shared library llama.cpp answers only with preloaded. On a lent GPU box every
  build of llama-cpp-python 0.3.36 segfaulted while loading any model and answered with the system's
  shared libstdc++ in ``LD_PRELOAD`` (its libraries carried a static C++ runtime); the installer writes
  this only when its smoke test, in a child process, crashed without the library and answered with it.
  The gateway then starts each llama.cpp runner with it preloaded, and ``make test`` runs the suite so.

Finding the package does not import it (nothing of llama.cpp is loaded in the gateway). ``python -m
adapters.engines.llamacpp.markers`` prints the library to preload, or nothing.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

CMAKE_ARGS = ".infer-cmake-args"
LD_PRELOAD = ".infer-ld-preload"


def package_dir() -> Path | None:
    """The installed ``llama_cpp`` package's folder, without importing it (None: not installed)."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def read(name: str) -> str | None:
    folder = package_dir()
    try:
        return (folder / name).read_text().strip() if folder is not None else None
    except OSError:
        return None


def write(name: str, text: str | None) -> None:
    """Record ``text`` under ``name`` beside the package (None: remove the record)."""
    folder = package_dir()
    if folder is None:
        return
    if text is None:
        (folder / name).unlink(missing_ok=True)
    else:
        (folder / name).write_text(text + "\n")


def preload_library() -> str | None:
    """The library the installer found llama.cpp needs preloaded here, if it still exists."""
    lib = read(LD_PRELOAD)
    return lib if lib and os.path.isabs(lib) and os.path.exists(lib) else None


def preload_env(env: Mapping[str, str]) -> dict[str, str] | None:
    """``env`` with the recorded library in front of its ``LD_PRELOAD``; None without a record."""
    lib = preload_library()
    if lib is None:
        return None
    current = [p for p in env.get("LD_PRELOAD", "").split() if p != lib]
    return {**env, "LD_PRELOAD": " ".join([lib, *current])}


def missing_preload() -> str | None:
    """The recorded library, when this process was started without it preloaded."""
    lib = preload_library()
    return None if lib is None or lib in os.environ.get("LD_PRELOAD", "").split() else lib


if __name__ == "__main__":
    print(preload_library() or "")
