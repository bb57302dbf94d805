"""The process boundary in the imports: every module of every package, parsed (AST), with the
imports inside functions too.

- ``native_engine`` imports nothing of the project but itself and ``gguf_io``;
- ``gguf_io`` (GGUF reading, tokenizers) is a leaf: only itself, the standard library, ``gguf``,
  ``numpy`` and ``tokenizers``;
- the request path's layers import downwards only: ``core`` (the contract) <- ``frontend`` (templates,
  tokens, tools) <- ``adapters`` (``engines/``, ``remote/``: siblings that never import each other) <-
  ``gateway`` <- ``cli``;
- every other package never imports ``native_engine``, except the native bridge
  (``adapters/engines/native/``) and ``accuracy/engines.py``, which runs both engines in the CLI's own
  process on purpose (``infer compare`` reads full-vocabulary logits; no server is involved).
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BRIDGES = (ROOT / "adapters" / "engines" / "native", ROOT / "accuracy" / "engines.py")
LEAF_THIRD_PARTY = {"gguf", "numpy", "tokenizers"}


def project_packages() -> set[str]:
    """The top-level packages pyproject ships (``packages.find``), plus the repo's tests and benches."""
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return {pattern.rstrip("*").rstrip(".") for pattern in found["include"]} | {"tests", "bench"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, submodules: set[str] = frozenset()) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved); ``from a.b import c``
    names ``a.b.c`` instead of ``a.b`` when that is one of ``submodules``."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join((package[: len(package) - node.level + 1] if node.level else [])
                            + ([node.module] if node.module else []))
            names.update(f"{base}.{a.name}" if f"{base}.{a.name}" in submodules else base for a in node.names)
    return names


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def top_levels(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imports(path)}


def test_the_packages_are_all_there():
    assert {"native_engine", "gguf_io", "core", "frontend", "adapters", "gateway", "cli", "benchmark"} <= project_packages()
    assert all(modules(p) for p in project_packages() - {"bench"})


def test_the_engine_imports_only_itself_and_gguf_io():
    project = project_packages()
    wrong = {f"{path.relative_to(ROOT)}: {sorted(found)}" for path in modules("native_engine")
             if (found := top_levels(path) & project - {"native_engine", "gguf_io"})}
    assert not wrong


def test_gguf_io_is_a_leaf():
    allowed = {"gguf_io", "__future__"} | LEAF_THIRD_PARTY | set(sys.stdlib_module_names)
    wrong = {f"{path.relative_to(ROOT)}: {sorted(found)}" for path in modules("gguf_io")
             if (found := top_levels(path) - allowed)}
    assert not wrong


LAYERS = ("core", "frontend", "adapters", "gateway", "cli")


def layer_of(name: str) -> str:
    """``adapters.engines.x`` -> ``adapters.engines``; ``gateway.app`` -> ``gateway``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "adapters" and len(parts) > 1 else parts[0]


@pytest.mark.parametrize("package", LAYERS[:-1])
def test_the_request_path_layers_import_downwards(package):
    above = set(LAYERS[LAYERS.index(package) + 1:])
    wrong = {f"{path.relative_to(ROOT)}: {sorted(found)}" for path in modules(package)
             if (found := top_levels(path) & above)}
    assert not wrong


def test_engines_and_remote_backends_are_siblings():
    wrong = {f"{path.relative_to(ROOT)}: {name}" for side, other in (("engines", "remote"), ("remote", "engines"))
             for path in sorted((ROOT / "adapters" / side).rglob("*.py"))
             for name in imports(path) if layer_of(name) == f"adapters.{other}"}
    assert not wrong


@pytest.mark.parametrize("package", sorted(project_packages() - {"native_engine", "tests", "bench"}))
def test_the_gateway_side_never_imports_the_engine(package):
    wrong = [str(path.relative_to(ROOT)) for path in modules(package)
             if not any(path.is_relative_to(bridge) for bridge in BRIDGES) and "native_engine" in top_levels(path)]
    assert not wrong


def test_the_parser_sees_relative_and_function_level_imports(tmp_path, monkeypatch):
    """The checks above are only as good as ``imports``: a relative import and one inside a function."""
    package = tmp_path / "native_engine" / "kernels"
    package.mkdir(parents=True)
    module = package / "probe.py"
    module.write_text("from ..loader import x\n\ndef f():\n    from registry.realmodels import cache_dir\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert imports(module) == {"native_engine.loader", "registry.realmodels"}


@pytest.mark.parametrize("env", [{}, {"XDG_CACHE_HOME": "/xdg"}, {"INFER_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/xdg"}])
def test_the_engine_keeps_its_kernels_in_infers_cache(env, monkeypatch, tmp_path):
    """The engine writes its cache rule itself (it may not import ``registry``): the two must agree."""
    from native_engine.kernels import cpu_kernels
    from registry.realmodels import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("INFER_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cpu_kernels.kernel_dir() == cache_dir() / "kernels"
