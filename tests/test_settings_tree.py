"""The one settings tree (``core/settings.py``): every ``INFER_*``/``OLLAMA_*`` variable is read there
and nowhere else, the README's table is the tree's, and the defaults that must agree across the
process boundary do.

A variable name written in code (a string such as ``"INFER_HOST"``, an f-string or a prefix
``"INFER_"``) outside ``core/settings.py`` is a read the tree does not see, so the scan fails on it;
a dict key is a child process's environment being set, not read, and is allowed. The native engine
may not import the project (``test_import_boundary.py``): it reads its own few variables, listed here.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from core.options import resolve_options
from core.settings import DEFAULTS, ClientSettings, LocalSettings, RegistrySettings, ServerSettings, SettingsError
from core.settings import env_fields, env_table, variables_of
from tests.test_import_boundary import modules, project_packages, top_levels

ROOT = Path(__file__).resolve().parents[1]
VARIABLE = re.compile(r"(INFER|OLLAMA)_[A-Z0-9_]*")
ENGINE_OWN = {"INFER_CACHE_DIR", "INFER_CPU_MARCH", "INFER_NO_CPU_KERNELS"}  # native_engine/kernels/cpu_kernels.py


def variable_names(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of each variable name (or ``INFER_`` prefix) the module writes, dict keys aside."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    keys = {id(k) for node in ast.walk(tree) if isinstance(node, ast.Dict) for k in node.keys if k is not None}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            head = node.values[0]
            keys.update(id(part) for part in node.values)
            if VARIABLE.match(str(head.value)):
                found.append((node.lineno, VARIABLE.match(str(head.value)).group()))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in keys:
            if VARIABLE.fullmatch(node.value):
                found.append((node.lineno, node.value))
    return sorted(found)


def shipped_modules(skip: str) -> list[Path]:
    return [p for package in sorted(project_packages() - {"tests", "bench", skip}) for p in modules(package)]


def test_no_variable_is_read_outside_the_settings_tree():
    wrong = [f"{path.relative_to(ROOT)}:{line}: {text}" for path in shipped_modules("native_engine")
             if path != ROOT / "core" / "settings.py" for line, text in variable_names(path)]
    assert not wrong, "read these through core/settings.py:\n" + "\n".join(wrong)


def test_the_contract_imports_nothing_of_the_project():
    """``core`` (the settings tree included) is the bottom: ``registry``, ``ledger``, ``gateway`` import it."""
    wrong = {f"{path.relative_to(ROOT)}: {sorted(found)}" for path in modules("core")
             if (found := top_levels(path) & project_packages() - {"core"})}
    assert not wrong


def test_the_engine_reads_only_its_own_few_variables():
    found = {text for path in modules("native_engine") for _, text in variable_names(path)}
    assert found == ENGINE_OWN


def test_the_scan_sees_reads_in_every_form(tmp_path):
    module = tmp_path / "probe.py"
    module.write_text('import os\nos.environ.get("INFER_X")\nos.getenv(f"OLLAMA_{n}")\n'
                      'env["INFER_" + n]\nchild = {**os.environ, "INFER_TEST_ENGINE": "1"}\n'
                      '"""INFER_HOST in prose is fine."""\n')
    assert variable_names(module) == [(2, "INFER_X"), (3, "OLLAMA_"), (4, "INFER_")]


def test_each_variable_is_read_by_one_field():
    variables = [v for _, _, field in env_fields() for v in variables_of(field)]
    assert len(variables) == len(set(variables)) and all(VARIABLE.fullmatch(v) for v in variables)


def test_the_readme_table_is_the_settings_tree():
    """The README's table of variables is ``python -m core.settings``'s output, row for row."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = env_table()
    assert table in readme, "regenerate the README's table: python -m core.settings"
    for _, name, field in env_fields():
        assert f"`{variables_of(field)[0]}`" in table and field.description in table, name


def test_the_engine_default_context_is_the_settings_one():
    from native_engine.config import EngineConfig

    assert EngineConfig(model="m").max_model_len == DEFAULTS.context_length == LocalSettings().context_length


@pytest.mark.parametrize("modelfile, asked, runs", [(None, None, 4096), (1024, None, 1024), (1024, 8192, 8192)])
def test_one_context_rule(modelfile, asked, runs):
    """num_ctx: the request's, else the Modelfile's, else INFER_CONTEXT_LENGTH (here OLLAMA_CONTEXT_LENGTH)."""
    settings = LocalSettings.from_env({"OLLAMA_CONTEXT_LENGTH": "4096"})
    options = resolve_options({"num_ctx": modelfile}, {"num_ctx": asked}, defaults=settings.option_defaults)
    assert options.num_ctx == runs


@pytest.mark.parametrize("engine", ["native", "llamacpp"])
def test_infer_compare_runs_with_the_servers_context(engine, tiny_store, monkeypatch):
    """``infer compare``'s in-process engines take INFER_CONTEXT_LENGTH, as ``infer serve`` does."""
    from accuracy.targets import open_target

    monkeypatch.setenv("INFER_CONTEXT_LENGTH", "256")
    target = open_target(f"tiny@{engine}", tiny_store)
    try:
        assert (target.engine.max_model_len if engine == "native" else target.llm.n_ctx()) == 256
    finally:
        target.close()


@pytest.mark.parametrize("policy", ["routing.route.RoutePolicy", "routing.slo.SLO", "routing.prefix.PrefixPolicy",
                                    "routing.disagg.DisaggPolicy"])
def test_runtime_policies_have_no_defaults_of_their_own(policy):
    import importlib

    module, _, name = policy.rpartition(".")
    fields = dataclasses.fields(getattr(importlib.import_module(module), name))
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING for f in fields)


def test_one_mapping_gives_the_whole_tree(tmp_path):
    env = {"INFER_HOME": str(tmp_path), "OLLAMA_HOST": "0.0.0.0:9000", "INFER_CONTEXT_LENGTH": "4096",
           "OLLAMA_CONTEXT_LENGTH": "1024", "INFER_API_KEY": "k", "INFER_LOCAL": "yes", "INFER_SHUTDOWN_GRACE": "2"}
    server = ServerSettings.from_env(env)
    assert (server.host, server.port, server.context_length, server.shutdown_grace) == ("0.0.0.0", 9000, 4096, 2.0)
    assert server.database_url == RegistrySettings.from_env(env).database_url == f"sqlite:///{tmp_path}/usage.db"
    client = ClientSettings.from_env(env)
    assert client.local and client.auth_headers == {"Authorization": "Bearer k"}
    with pytest.raises(SettingsError, match="invalid OLLAMA_CONTEXT_LENGTH"):
        LocalSettings.from_env({"OLLAMA_CONTEXT_LENGTH": "lots"})


def test_only_from_env_reads_the_environment(monkeypatch):
    """Constructing a settings object reads nothing: a test or a runner gets exactly what it passes."""
    monkeypatch.setenv("INFER_ENGINE", "native")
    monkeypatch.setenv("INFER_NATIVE", '{"max_loras": 8}')
    assert LocalSettings().engine == "llamacpp" and LocalSettings().native.max_loras is None
    assert LocalSettings.from_env().engine == "native" and LocalSettings.from_env().native.max_loras == 8
