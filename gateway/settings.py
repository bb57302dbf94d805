"""Server settings for ``infer serve``, read from ``INFER_*`` variables and validated at start.

| variable | default | meaning |
|---|---|---|
| ``INFER_HOST`` | ``127.0.0.1:11434`` | ``[scheme://]host[:port]`` to bind |
| ``INFER_ORIGINS`` | — | extra allowed CORS origins, comma-separated, ``*`` wildcards |
| ``INFER_API_KEYS`` | — | comma-separated keys; when set, requests need ``Authorization: Bearer <key>`` |
| ``INFER_CONFIG`` | — | YAML file with remote ``backends:`` (vLLM, TGI, TensorRT-LLM, Triton, Ollama, llama.cpp, OpenAI) |
| ``INFER_DATABASE_URL`` | ``sqlite:///$INFER_HOME/usage.db`` | usage ledger (any SQLAlchemy URL) |

The in-process engines' variables (``INFER_ENGINE``, ``INFER_KEEP_ALIVE``, ``INFER_NUM_PARALLEL``,
``INFER_MAX_QUEUE``, ``INFER_MAX_LOADED_MODELS``, ``INFER_CONTEXT_LENGTH``) are read into
``local`` (:class:`adapters.settings.LocalSettings`), where their defaults live.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from registry.settings import RegistrySettings

from ledger.db import ENV_VAR as DB_ENV_VAR, default_database_url
from adapters.settings import DEFAULTS, LocalSettings

DEFAULT_PORT = 11434
DEFAULT_ORIGINS = (
    "http://localhost", "https://localhost", "http://localhost:*", "https://localhost:*",
    "http://127.0.0.1", "https://127.0.0.1", "http://127.0.0.1:*", "https://127.0.0.1:*",
    "http://0.0.0.0", "https://0.0.0.0", "http://0.0.0.0:*", "https://0.0.0.0:*",
    "app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*",
)


class SettingsError(ValueError):
    """A setting is invalid; the message names the variable and the expected form."""


class ServerSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str = Field(default="127.0.0.1", description="Address to bind (INFER_HOST).")
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535, description="Port to bind (INFER_HOST).")
    origins: tuple[str, ...] = Field(default=(), description="Extra CORS origins (INFER_ORIGINS).")
    api_key_hashes: frozenset[str] = Field(default=frozenset(), description="sha256 of accepted API keys.")
    local: LocalSettings = Field(default_factory=lambda: DEFAULTS, description="The in-process engines.")
    config: Path | None = Field(default=None, description="Remote backends file (INFER_CONFIG / --config).")
    max_body_bytes: int = Field(default=32 << 20, ge=1024, description="Largest accepted request body.")
    max_blob_bytes: int = Field(default=256 << 30, ge=1, description="Largest model file /api/blobs accepts "
                                "(INFER_MAX_BLOB_BYTES); free disk space less a GiB caps it too.")
    redis_url: str | None = Field(default=None, description="Redis for per-key rate limits shared by replicas "
                                  "(INFER_REDIS_URL / --redis-url); in process memory without it.")
    shutdown_grace: float = Field(default=5.0, ge=0.0, description="Seconds running requests get to finish "
                                  "after SIGTERM/SIGINT; the rest then end with an error event and their row.")
    database_url: str = Field(description="Usage ledger URL (INFER_DATABASE_URL).")
    registry: RegistrySettings

    @field_validator("origins")
    @classmethod
    def _no_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(o.strip() for o in value if o.strip())

    # The engine settings the banner, tests and routes read; their defaults live in LocalSettings.
    keep_alive = property(lambda self: self.local.keep_alive)
    num_parallel = property(lambda self: self.local.num_parallel)
    context_length = property(lambda self: self.local.context_length)
    engine = property(lambda self: self.local.engine)

    @property
    def bind_url(self) -> str:
        """Where the server listens, as given (``http://0.0.0.0:11434`` for every interface)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        return self.host in ("127.0.0.1", "localhost", "::1") or self.host.startswith("127.")

    def origin_allowed(self, origin: str) -> bool:
        return any(fnmatch.fnmatchcase(origin, pattern) for pattern in (*DEFAULT_ORIGINS, *self.origins))

    def key_allowed(self, key: str) -> bool:
        return hash_key(key) in self.api_key_hashes

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> "ServerSettings":
        env = dict(os.environ if env is None else env)
        registry = RegistrySettings.from_env(env)
        values: dict[str, Any] = {"registry": registry, "database_url": _database_url(env, registry.home)}
        local = {k: overrides.pop(k) for k in list(overrides) if k in LocalSettings.model_fields}
        try:
            values["local"] = LocalSettings.from_env(env, **local)
            values.update(_from_env(env))
            values.update({k: v for k, v in overrides.items() if v is not None})
            return cls(**values)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise SettingsError(f"invalid setting {err['loc'][0]}: {err['msg']}") from None
        except ValueError as exc:
            raise SettingsError(str(exc)) from None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def parse_host(text: str) -> tuple[str, int]:
    """Ollama's ``OLLAMA_HOST`` grammar: ``[scheme://]host[:port][/path]``."""
    text = text.strip().strip("\"'")
    scheme, _, rest = text.rpartition("://")
    rest = rest.split("/", 1)[0]
    default_port = {"http": 80, "https": 443}.get(scheme, DEFAULT_PORT)
    if rest.startswith("["):  # [::1]:port
        host, _, port = rest[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = rest.rpartition(":") if rest.count(":") == 1 else (rest, "", "")
    try:
        return host or "127.0.0.1", int(port) if port else default_port
    except ValueError:
        raise SettingsError(f"invalid INFER_HOST {text!r}: expected [scheme://]host[:port]") from None


def _from_env(env: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if env.get("INFER_HOST"):
        out["host"], out["port"] = parse_host(env["INFER_HOST"])
    if env.get("INFER_ORIGINS"):
        out["origins"] = tuple(env["INFER_ORIGINS"].split(","))
    if env.get("INFER_API_KEYS"):
        out["api_key_hashes"] = frozenset(hash_key(k.strip()) for k in env["INFER_API_KEYS"].split(",") if k.strip())
    if env.get("INFER_REDIS_URL"):
        out["redis_url"] = env["INFER_REDIS_URL"].strip()
    if env.get("INFER_MAX_BLOB_BYTES"):
        out["max_blob_bytes"] = env["INFER_MAX_BLOB_BYTES"].strip()
    if env.get("INFER_CONFIG"):
        out["config"] = Path(env["INFER_CONFIG"].strip()).expanduser()
    return out


def _database_url(env: dict[str, str], home: Path) -> str:
    return env.get(DB_ENV_VAR) or default_database_url(home)
