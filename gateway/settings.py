"""Server settings for ``infer serve``, read from ``INFER_*`` variables and validated at start.

| variable | default | meaning |
|---|---|---|
| ``INFER_HOST`` | ``127.0.0.1:11434`` | ``[scheme://]host[:port]`` to bind |
| ``INFER_ORIGINS`` | — | extra allowed CORS origins, comma-separated, ``*`` wildcards |
| ``INFER_API_KEYS`` | — | comma-separated keys; when set, requests need ``Authorization: Bearer <key>`` |
| ``INFER_KEEP_ALIVE`` | ``5m`` | how long an idle model stays loaded (``-1`` = forever, ``0`` = unload) |
| ``INFER_NUM_PARALLEL`` | ``1`` | concurrent requests per model (one llama.cpp context each) |
| ``INFER_MAX_QUEUE`` | ``512`` | requests waiting per model before ``503`` |
| ``INFER_MAX_LOADED_MODELS`` | ``3`` | models kept loaded at once |
| ``INFER_CONTEXT_LENGTH`` | ``2048`` | default ``num_ctx`` when neither model nor request sets it |
| ``INFER_ENGINE`` | ``llamacpp`` | in-process engine for store models: ``llamacpp`` or ``native`` |
| ``INFER_CONFIG`` | — | YAML file with remote ``backends:`` (vLLM, TGI, TensorRT-LLM, Triton, Ollama, llama.cpp, OpenAI) |
| ``INFER_DATABASE_URL`` | ``sqlite:///$INFER_HOME/usage.db`` | usage ledger (any SQLAlchemy URL) |
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from registry.settings import RegistrySettings

from ledger.db import ENV_VAR as DB_ENV_VAR, default_database_url
from gateway.durations import parse_duration

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
    keep_alive: float = Field(default=300.0, description="Seconds an idle model stays loaded.")
    num_parallel: int = Field(default=1, ge=1, le=64)
    max_queue: int = Field(default=512, ge=0)
    max_loaded_models: int = Field(default=3, ge=0)
    context_length: int = Field(default=2048, ge=16, le=1 << 20)
    engine: Literal["llamacpp", "native"] = Field(default="llamacpp", description="Default in-process engine "
                                                  "(INFER_ENGINE); a request may pick another with the engine option.")
    config: Path | None = Field(default=None, description="Remote backends file (INFER_CONFIG / --config).")
    max_body_bytes: int = Field(default=32 << 20, ge=1024, description="Largest accepted request body.")
    database_url: str = Field(description="Usage ledger URL (INFER_DATABASE_URL).")
    registry: RegistrySettings

    @field_validator("origins")
    @classmethod
    def _no_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(o.strip() for o in value if o.strip())

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
        try:
            values.update(_from_env(env))
            values.update({k: v for k, v in overrides.items() if v is not None})
            return cls(**values)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise SettingsError(f"invalid setting {err['loc'][0]}: {err['msg']}") from None


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
    if env.get("INFER_CONFIG"):
        out["config"] = Path(env["INFER_CONFIG"].strip()).expanduser()
    if env.get("INFER_ENGINE"):
        out["engine"] = env["INFER_ENGINE"].strip()
    if env.get("INFER_KEEP_ALIVE"):
        out["keep_alive"] = _duration("INFER_KEEP_ALIVE", env["INFER_KEEP_ALIVE"])
    for var, key in (("INFER_NUM_PARALLEL", "num_parallel"), ("INFER_MAX_QUEUE", "max_queue"),
                     ("INFER_MAX_LOADED_MODELS", "max_loaded_models"), ("INFER_CONTEXT_LENGTH", "context_length")):
        if env.get(var):
            out[key] = _int(var, env[var])
    return out


def _duration(var: str, text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise SettingsError(f"invalid {var}: {exc}") from None


def _int(var: str, text: str) -> int:
    try:
        return int(text.strip().strip("\"'"))
    except ValueError:
        raise SettingsError(f"invalid {var} {text!r}: expected an integer") from None


def _database_url(env: dict[str, str], home: Path) -> str:
    return env.get(DB_ENV_VAR) or default_database_url(home)
