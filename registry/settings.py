"""Where things live: ``INFER_HOME`` (default ``~/.infer``) and the model store.

The store is ``INFER_MODELS``, else Ollama's ``OLLAMA_MODELS``; with neither (and no ``INFER_HOME``)
an existing ``~/.ollama/models`` is used as is (the layout is the same, so a user's Ollama models
are there at once), else ``$INFER_HOME/models``.

:func:`env_setting` is how every settings module reads a variable: ``INFER_<NAME>``, else Ollama's
``OLLAMA_<NAME>``, trimmed of spaces and quotes as Ollama trims them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, Field

OLLAMA_STORE = "~/.ollama/models"  # Ollama's default store (envconfig.Models)


def env_setting(env: Mapping[str, str], name: str, *, ollama: bool = True) -> tuple[str, str] | None:
    """``(variable, value)`` of ``INFER_<name>``, else ``OLLAMA_<name>``; None when neither is set."""
    for var in ("INFER_" + name, "OLLAMA_" + name)[: 2 if ollama else 1]:
        value = env.get(var, "").strip().strip("\"'")
        if value:
            return var, value
    return None


def default_models(env: Mapping[str, str], home: Path) -> Path:
    """The store: INFER_MODELS, OLLAMA_MODELS, an existing ~/.ollama/models, else ``home``/models."""
    found = env_setting(env, "MODELS")
    if found:
        return Path(found[1]).expanduser()
    ollama = Path(OLLAMA_STORE).expanduser()
    if not env.get("INFER_HOME") and ollama.is_dir():
        return ollama
    return home / "models"


class RegistrySettings(BaseModel):
    home: Path = Field(description="Root of infer's state (INFER_HOME).")
    models: Path = Field(description="Model store: blobs/ and manifests/ (INFER_MODELS, OLLAMA_MODELS).")
    insecure: bool = Field(default=False, description="Allow plain-http registries (INFER_INSECURE).")
    registry_auth: str | None = Field(
        default=None, description="user:password for registries that ask for Basic credentials "
        "in their token flow (INFER_REGISTRY_AUTH)."
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "RegistrySettings":
        env = dict(os.environ if env is None else env)
        home = Path(env.get("INFER_HOME") or "~/.infer").expanduser()
        insecure = env.get("INFER_INSECURE", "").lower() in ("1", "true", "yes")
        return cls(home=home, models=default_models(env, home), insecure=insecure,
                   registry_auth=env.get("INFER_REGISTRY_AUTH") or None)
