"""Where things live: ``INFER_HOME`` (default ``~/.infer``) and ``INFER_MODELS`` (its ``models/``).

``INFER_MODELS=~/.ollama/models`` serves an existing Ollama store as is: the layout is the same.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field


class RegistrySettings(BaseModel):
    home: Path = Field(description="Root of infer's state (INFER_HOME).")
    models: Path = Field(description="Model store: blobs/ and manifests/ (INFER_MODELS).")
    insecure: bool = Field(default=False, description="Allow plain-http registries (INFER_INSECURE).")
    registry_auth: str | None = Field(
        default=None, description="user:password for registries that ask for Basic credentials "
        "in their token flow (INFER_REGISTRY_AUTH)."
    )

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "RegistrySettings":
        env = dict(os.environ if env is None else env)
        home = Path(env.get("INFER_HOME") or "~/.infer").expanduser()
        models = Path(env.get("INFER_MODELS") or home / "models").expanduser()
        insecure = env.get("INFER_INSECURE", "").lower() in ("1", "true", "yes")
        return cls(home=home, models=models, insecure=insecure,
                   registry_auth=env.get("INFER_REGISTRY_AUTH") or None)
