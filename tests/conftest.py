"""Every test gets its own INFER_HOME, so nothing touches the user's real store."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def infer_home(tmp_path, monkeypatch):
    home = tmp_path / "infer-home"
    monkeypatch.setenv("INFER_HOME", str(home))
    for var in ("INFER_MODELS", "INFER_INSECURE", "INFER_REGISTRY_AUTH", "INFER_RAISE_ERRORS"):
        monkeypatch.delenv(var, raising=False)
    return home
