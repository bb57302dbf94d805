"""Server settings for ``infer serve``, read from ``INFER_*`` variables and validated at start.

| variable | default | meaning |
|---|---|---|
| ``INFER_HOST`` (``OLLAMA_HOST``) | ``127.0.0.1:11434`` | ``[scheme://]host[:port]`` to bind (and where the CLI looks for a server) |
| ``INFER_ORIGINS`` (``OLLAMA_ORIGINS``) | — | extra allowed CORS origins, comma-separated, ``*`` wildcards |
| ``INFER_API_KEYS`` | — | comma-separated operator keys; when set, requests need a key (``gateway/policy/access.py``) |
| ``INFER_CONFIG`` | — | YAML file with remote ``backends:`` (vLLM, TGI, TensorRT-LLM, Triton, Ollama, llama.cpp, OpenAI) |
| ``INFER_DATABASE_URL`` | ``sqlite:///$INFER_HOME/usage.db`` | usage ledger (any SQLAlchemy URL) |

The in-process engines' variables (``INFER_ENGINE``, ``INFER_KEEP_ALIVE``, ``INFER_NUM_PARALLEL``,
``INFER_MAX_QUEUE``, ``INFER_MAX_LOADED_MODELS``, ``INFER_CONTEXT_LENGTH``) are read into
``local`` (:class:`core.settings.LocalSettings`), where their defaults live. Each ``INFER_X``
in parentheses falls back to Ollama's ``OLLAMA_X`` when unset (``registry.settings.env_setting``).
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Any

from core.durations import parse_duration
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from registry.settings import RegistrySettings, env_setting

from ledger.db import ENV_VAR as DB_ENV_VAR, default_database_url
from core.settings import DEFAULTS, LocalSettings
from gateway.policy.access import hash_key

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 11434  # Ollama's
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

    host: str = Field(default=DEFAULT_HOST, description="Address to bind (INFER_HOST).")
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535, description="Port to bind (INFER_HOST).")
    origins: tuple[str, ...] = Field(default=(), description="Extra CORS origins (INFER_ORIGINS).")
    api_key_hashes: frozenset[str] = Field(default=frozenset(), description="sha256 of accepted API keys.")
    local: LocalSettings = Field(default_factory=lambda: DEFAULTS, description="The in-process engines.")
    config: Path | None = Field(default=None, description="Remote backends file (INFER_CONFIG / --config).")
    max_body_bytes: int = Field(default=32 << 20, ge=1024, description="Largest accepted request body.")
    max_prompt_bytes: int = Field(default=8 << 20, ge=1024, description="Largest body a prompt route takes "
                                  "(INFER_MAX_PROMPT_BYTES): parsing it holds the event loop about 4 ms a MB.")
    max_messages: int = Field(default=10_000, ge=1, description="Most messages (or Responses input items) one "
                              "request may send (INFER_MAX_MESSAGES); more is a 413 before any work.")
    max_tools: int = Field(default=512, ge=1, description="Most tools one request may send (INFER_MAX_TOOLS); "
                           "more is a 413 before any work.")
    max_blob_bytes: int = Field(default=256 << 30, ge=1, description="Largest model file /api/blobs accepts "
                                "(INFER_MAX_BLOB_BYTES); free disk space less a GiB caps it too.")
    redis_url: str | None = Field(default=None, description="Redis for per-key rate limits shared by replicas "
                                  "(INFER_REDIS_URL / --redis-url); in process memory without it.")
    hold_ttl_s: float = Field(default=60.0, ge=1.0, description="Seconds a budget hold outlives its last renewal "
                              "(INFER_HOLD_TTL_S): a replica renews its running requests' holds every quarter "
                              "of it; one that dies or loses the database longer than this releases them.")
    shutdown_grace: float = Field(default=5.0, ge=0.0, description="Seconds running requests get to finish "
                                  "after SIGTERM/SIGINT; the rest then end with an error event and their row.")
    database_url: str = Field(description="Usage ledger URL (INFER_DATABASE_URL).")
    responses_retention: float = Field(default=30 * 86400.0, ge=0.0, description="Seconds a stored /v1/responses "
                                       "answer stays readable for previous_response_id (INFER_RESPONSES_RETENTION, "
                                       "a duration such as 720h or seconds; 0 stores none).")
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
        return loopback_url(self.host, self.port)

    @property
    def is_loopback(self) -> bool:
        return self.host in ("127.0.0.1", "localhost", "::1") or self.host.startswith("127.")

    def origin_allowed(self, origin: str) -> bool:
        return any(fnmatch.fnmatchcase(origin, pattern) for pattern in (*DEFAULT_ORIGINS, *self.origins))

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


def parse_host(text: str, variable: str = "INFER_HOST") -> tuple[str, int]:
    """Ollama's ``OLLAMA_HOST`` grammar: ``[scheme://]host[:port][/path]``: ``0.0.0.0`` (port 11434),
    ``host:port``, ``http://host:port`` (``http://host`` = port 80), ``:port`` (on 127.0.0.1: Ollama
    binds every interface for that form; here that takes ``0.0.0.0:port``)."""
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
        raise SettingsError(f"invalid {variable} {text!r}: expected [scheme://]host[:port]") from None


def host_from_env(env: dict[str, str]) -> tuple[str, int]:
    """The address ``infer serve`` binds: INFER_HOST, else OLLAMA_HOST, else 127.0.0.1:11434."""
    found = env_setting(env, "HOST")
    return parse_host(found[1], found[0]) if found else (DEFAULT_HOST, DEFAULT_PORT)


def client_url(env: dict[str, str]) -> str:
    """Where the CLI finds ``infer serve`` (or Ollama): the bound address, a wildcard read as loopback."""
    return loopback_url(*host_from_env(env))


def loopback_url(host: str, port: int) -> str:
    """``http://host:port`` for a client, a wildcard address read as loopback (as Ollama's clients do)."""
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _from_env(env: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["host"], out["port"] = host_from_env(env)
    if origins := env_setting(env, "ORIGINS"):
        out["origins"] = tuple(origins[1].split(","))
    if env.get("INFER_API_KEYS"):
        out["api_key_hashes"] = frozenset(hash_key(k.strip()) for k in env["INFER_API_KEYS"].split(",") if k.strip())
    if env.get("INFER_REDIS_URL"):
        out["redis_url"] = env["INFER_REDIS_URL"].strip()
    if env.get("INFER_HOLD_TTL_S"):
        out["hold_ttl_s"] = env["INFER_HOLD_TTL_S"].strip()
    for name in ("max_prompt_bytes", "max_messages", "max_tools"):
        if env.get(f"INFER_{name.upper()}"):
            out[name] = env[f"INFER_{name.upper()}"].strip()
    if env.get("INFER_MAX_BLOB_BYTES"):
        out["max_blob_bytes"] = env["INFER_MAX_BLOB_BYTES"].strip()
    if env.get("INFER_RESPONSES_RETENTION"):
        out["responses_retention"] = parse_duration(env["INFER_RESPONSES_RETENTION"].strip())
    if env.get("INFER_CONFIG"):
        out["config"] = Path(env["INFER_CONFIG"].strip()).expanduser()
    return out


def _database_url(env: dict[str, str], home: Path) -> str:
    return env.get(DB_ENV_VAR) or default_database_url(home)
