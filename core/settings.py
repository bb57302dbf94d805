"""The one settings tree: every ``INFER_*`` (and Ollama's ``OLLAMA_*``) variable is read here, and
nowhere else (``tests/test_settings_tree.py`` fails on a read outside this module); each default is
written once, on its field.

    RegistrySettings   where things live: INFER_HOME, the model store, the cache, the usage ledger
    LocalSettings      the in-process engines (``NativeSettings``: the native engine's knobs)
    ServerSettings     ``infer serve``: address, keys, limits, config file (holds the two above)
    ClientSettings     the CLI as a client: which server, which key, errors raised or printed

Each field that comes from the environment names its variables (``env(...)`` in its ``Field``):
the first one set wins, trimmed of spaces and quotes as Ollama trims them; an ``OLLAMA_X`` after
``INFER_X`` is Ollama's own variable, read when ours is unset. ``from_env(env)`` reads a mapping
(``os.environ`` when None) and validates at start: a bad value is a ``SettingsError`` naming the
variable. ``python -m core.settings`` prints the README's table of variables (the test checks that
the README holds exactly that table).

**Context length, one rule** (``infer serve``, ``infer run``, ``infer compare``, ``LLMEngine``): a
model runs with ``num_ctx`` tokens of context: the request's option, else the Modelfile's ``PARAMETER
num_ctx``, else ``INFER_CONTEXT_LENGTH`` (2048, Ollama's long-standing default). The native engine
stops at the model's trained context (its position tables end there); llama.cpp runs past it as
llama.cpp allows (with a warning in its log). The native engine cannot import this module: its
``EngineConfig.max_model_len`` defaults to the same 2048 (a test keeps the two equal);
``max_model_len=None`` asks it for the whole trained context (vLLM's default), on purpose only.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.durations import parse_duration, parse_keep_alive

ENV_PREFIX = "INFER_"
OLLAMA_STORE = "~/.ollama/models"  # Ollama's default store (envconfig.Models)
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 11434  # Ollama's
DEFAULT_ORIGINS = (
    "http://localhost", "https://localhost", "http://localhost:*", "https://localhost:*",
    "http://127.0.0.1", "https://127.0.0.1", "http://127.0.0.1:*", "https://127.0.0.1:*",
    "http://0.0.0.0", "https://0.0.0.0", "http://0.0.0.0:*", "https://0.0.0.0:*",
    "app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*",
)
TRUE = ("1", "true", "yes")


class SettingsError(ValueError):
    """A setting is invalid; the message names the variable and the expected form."""


def env(*variables: str, shown: str | None = None) -> dict[str, Any]:
    """A field's ``json_schema_extra``: the variables it is read from, in order, and its default as the
    README shows it (when the field's own default is computed or not readable as is)."""
    return {"env": variables, **({"shown": shown} if shown is not None else {})}


def variables_of(field: Any) -> tuple[str, ...]:
    extra = field.json_schema_extra
    return tuple(extra.get("env", ())) if isinstance(extra, dict) else ()


def env_name(cls: type[BaseModel], name: str) -> str:
    """The variable a field is read from (its first), for messages that tell the user what to set."""
    return variables_of(cls.model_fields[name])[0]


def env_value(env: Mapping[str, str], variables: tuple[str, ...]) -> tuple[str, str] | None:
    """``(variable, value)`` of the first of ``variables`` set to a non-empty value; None when none is."""
    for var in variables:
        value = env.get(var, "").strip().strip("\"'")
        if value:
            return var, value
    return None


def read_env(cls: type[BaseModel], env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The raw values of ``cls``'s environment-backed fields that are set, and the variable of each."""
    values, found_in = {}, {}
    for name, field in cls.model_fields.items():
        found = env_value(env, variables_of(field))
        if found and found != ("OLLAMA_MAX_LOADED_MODELS", "0"):  # Ollama's 0 = auto: our default
            found_in[name], values[name] = found
    return values, found_in


def validated(cls: type[BaseModel], values: dict[str, Any], found_in: dict[str, str]) -> Any:
    """``cls`` from ``values``; a SettingsError names the variable (or the field) that is wrong."""
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "settings"
        raise SettingsError(f"invalid {found_in.get(name, name)}: {err['msg']}") from None


def _environ(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _flag(value: Any) -> Any:
    """Ollama's reading of a boolean variable: 1, true or yes; anything else is off."""
    return value.strip().lower() in TRUE if isinstance(value, str) else value


# -- where things live ---------------------------------------------------------------------------


class RegistrySettings(BaseModel):
    """``INFER_HOME`` and what lives under it. The store is ``INFER_MODELS``, else ``OLLAMA_MODELS``; with
    neither (and no ``INFER_HOME``) an existing ``~/.ollama/models`` is used as is (the layout is the
    same, so a user's Ollama models are there at once), else ``$INFER_HOME/models``."""

    model_config = ConfigDict(frozen=True)

    home: Path = Field(default=Path("~/.infer"), json_schema_extra=env("INFER_HOME", shown="`~/.infer`"),
                       description="Root of infer's state")
    models: Path = Field(json_schema_extra=env("INFER_MODELS", "OLLAMA_MODELS", shown="`~/.ollama/models` if it "
                                               "exists (and `INFER_HOME` is unset), else `$INFER_HOME/models`"),
                         description="The model store; the layout is Ollama's, so your Ollama models work without a "
                                     "re-download")
    database_url: str = Field(json_schema_extra=env("INFER_DATABASE_URL", shown="`sqlite:///$INFER_HOME/usage.db`"),
                              description="The usage ledger: any SQLAlchemy URL (`--db`; "
                                          "`postgresql+psycopg://…` for replicas sharing one ledger)")
    cache_dir: Path = Field(json_schema_extra=env("INFER_CACHE_DIR", shown="`$XDG_CACHE_HOME/infer`, else "
                                                  "`~/.cache/infer`"),
                            description="Downloaded test models (`make demo`, `tests/realmodel/`) and the native "
                                        "engine's compiled C kernels (`kernels/`)")
    insecure: bool = Field(default=False, json_schema_extra=env("INFER_INSECURE"),
                           description="Allow plain-http registries everywhere (same as `--insecure`)")
    registry_auth: str | None = Field(default=None, json_schema_extra=env("INFER_REGISTRY_AUTH"),
                                      description="`user:password` for registries whose token endpoint asks for Basic "
                                                  "credentials")
    registry_serve_auth: str | None = Field(default=None, json_schema_extra=env("INFER_REGISTRY_SERVE_AUTH"),
                                            description="`user:password` that `infer registry serve` requires")

    _insecure = field_validator("insecure", mode="before")(classmethod(lambda cls, value: _flag(value)))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "RegistrySettings":
        env = _environ(env)
        values, found_in = read_env(cls, env)
        home = Path(values.get("home") or cls.model_fields["home"].default).expanduser()
        values["home"] = home
        values.setdefault("models", default_models(home, explicit_home="home" in found_in))
        values.setdefault("database_url", default_database_url(home))
        values.setdefault("cache_dir", default_cache_dir(env))
        return validated(cls, values, found_in)

    @field_validator("home", "models", "cache_dir", mode="after")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()


def default_models(home: Path, *, explicit_home: bool) -> Path:
    """An existing ``~/.ollama/models`` when INFER_HOME is not given, else ``home``/models."""
    ollama = Path(OLLAMA_STORE).expanduser()
    return ollama if not explicit_home and ollama.is_dir() else home / "models"


def default_database_url(home: Path) -> str:
    return f"sqlite:///{home / 'usage.db'}"


def default_cache_dir(env: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME/infer``, else ``~/.cache/infer`` (``native_engine/kernels/cpu_kernels.py`` writes
    the same rule: the engine may not import this module)."""
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "infer"


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The cache directory alone (INFER_CACHE_DIR, else the XDG rule), without the rest of the tree."""
    env = _environ(env)
    found = env_value(env, variables_of(RegistrySettings.model_fields["cache_dir"]))
    return Path(found[1]).expanduser() if found else default_cache_dir(env)


# -- the in-process engines ----------------------------------------------------------------------


class NativeSettings(BaseModel):
    """Engine knobs for every model the native backend loads: ``EngineConfig`` fields by the same names
    (``adapters.engines.native.backend.engine_config`` builds it; this tree imports nothing of the engine).
    None, the default of each, is the engine's own default (``native_engine/config.py``), so ``infer
    serve`` and ``LLMEngine.from_model`` cannot disagree: each default is written once, there."""

    model_config = ConfigDict(frozen=True)

    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=16)
    block_size: int | None = Field(default=None, ge=1)
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1)
    dtype: str | None = None
    device: str | None = None
    enable_prefix_caching: bool | None = None
    max_loras: int | None = Field(default=None, ge=0, description="LoRA adapters resident at once in one model's "
                                  "engine (requests for more wait); 0: adapter models cannot run natively.")
    cpu_bf16_prefill: bool | None = Field(default=None, description="f32 on a CPU with AMX or AVX512-BF16: prefill "
                                          "rows in bf16 (~2.5x the prefill rate, outputs off by bf16 rounding); a "
                                          "CPU that cannot prove it at load keeps f32")
    # Where the ranks of a tensor-parallel group meet, when the gateway started them (the runner starter
    # sets it for the group it launches; None: an engine starts its own ranks).
    distributed_init_method: str | None = None

    def given(self) -> dict[str, Any]:
        """The knobs set (the rest are the engine's defaults)."""
        return self.model_dump(exclude_none=True)


class LocalSettings(BaseSettings):
    """``infer serve`` (``ServerSettings.local``) and ``infer run`` read the same variables here; the
    llama.cpp pool, the native engine and the option defaults (``num_ctx``) all derive from it."""

    # A BaseSettings for its env prefix only: ``from_env`` reads the variables, constructing one reads none.
    model_config = SettingsConfigDict(frozen=True, env_prefix=ENV_PREFIX, extra="ignore")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):  # type: ignore[override]
        return (init_settings,)

    engine: Literal["llamacpp", "native", "scripted"] = Field(
        default="llamacpp", json_schema_extra=env("INFER_ENGINE"),
        description="Engine for store models: `llamacpp` or `native`; a request picks another with `\"engine\"` "
                    "(OpenAI body) or `\"options\": {\"engine\": ...}` (Ollama)")
    keep_alive: float = Field(default=300.0,
                              json_schema_extra=env("INFER_KEEP_ALIVE", "OLLAMA_KEEP_ALIVE", shown="`5m`"),
                              description="How long an idle model stays loaded (`-1` forever, `0` unload at once)")
    num_parallel: int = Field(default=1, ge=1, le=64,
                              json_schema_extra=env("INFER_NUM_PARALLEL", "OLLAMA_NUM_PARALLEL"),
                              description="Concurrent requests per loaded model")
    max_queue: int = Field(default=512, ge=0, json_schema_extra=env("INFER_MAX_QUEUE", "OLLAMA_MAX_QUEUE"),
                           description="Requests waiting per model before `503`")
    max_loaded_models: int = Field(default=3, ge=0, json_schema_extra=env("INFER_MAX_LOADED_MODELS",
                                                                         "OLLAMA_MAX_LOADED_MODELS"),
                                   description="Runners (loaded models) at once: the idle one expiring first stops; "
                                               "when all are busy a request waits for one; `0` = no limit (Ollama's "
                                               "`0` means \"auto\": the default here)")
    context_length: int = Field(default=2048, ge=16, le=1 << 20,
                                json_schema_extra=env("INFER_CONTEXT_LENGTH", "OLLAMA_CONTEXT_LENGTH"),
                                description="`num_ctx` when neither the request nor the Modelfile sets one: `serve`, `run`, "
                                            "`compare` and `LLMEngine` alike (the native engine stops at the "
                                            "model's trained context)")
    load_timeout: float = Field(default=300.0, gt=0, json_schema_extra=env("INFER_LOAD_TIMEOUT", "OLLAMA_LOAD_TIMEOUT",
                                                                          shown="`5m`"),
                                description="A runner that has not loaded its model by then is killed (`502`)")
    hang_timeout: float = Field(default=300.0, gt=0, json_schema_extra=env("INFER_HANG_TIMEOUT", shown="`5m`"),
                                description="A runner with requests in flight that sends no event for this long is "
                                            "killed as hung")
    test_engine: bool = Field(default=False, json_schema_extra=env("INFER_TEST_ENGINE"),
                              description="`1` offers the model-less `scripted` engine, whose prompts can crash or "
                                          "hang its runner (tests, benches, fault drills)")
    tensor_parallel: int = Field(default=1, ge=1, le=64, json_schema_extra=env("INFER_TENSOR_PARALLEL"),
                                 description="Ranks each native model is split over (`--tensor-parallel`); a "
                                 "Modelfile's `PARAMETER tensor_parallel` or a request's option overrides it")
    native: NativeSettings = Field(default_factory=NativeSettings, json_schema_extra=env("INFER_NATIVE", shown="`{}`"),
                                   description="The native engine's knobs as JSON, `EngineConfig` fields: "
                                               "`max_num_seqs`, `max_num_batched_tokens`, `block_size`, "
                                               "`kv_cache_memory_bytes`, `dtype`, `device`, `enable_prefix_caching`, "
                                               "`max_loras`, `cpu_bf16_prefill` (e.g. `{\"max_loras\": 8}`); unset "
                                               "ones are the "
                                               "engine's defaults")
    kv_role: Literal["prefill", "decode", "both"] = Field(
        default="both", json_schema_extra=env("INFER_KV_ROLE"),
        description="The native engine's part in prefill/decode disaggregation (vLLM's `kv_role`; `infer serve "
        "--role`): prefill refuses decode legs, decode refuses prefill legs, both takes either.")
    speculative: str | None = Field(
        default=None, json_schema_extra=env("INFER_SPECULATIVE", shown="off"),
        description="Speculative decoding in the native engine: `ngram[:k=4]`, `draft:MODEL[:k=4]` or `off` "
        "(`--speculative`); a Modelfile's `PARAMETER speculative` overrides it, a request's `speculative` turns it "
        "off/on")

    @field_validator("native", mode="before")
    @classmethod
    def _native(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    @field_validator("speculative", mode="before")
    @classmethod
    def _speculative(cls, value: Any) -> Any:
        return check_speculative(value)

    @field_validator("keep_alive", "load_timeout", "hang_timeout", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        plain = isinstance(value, (str, int, float)) and not isinstance(value, bool)
        return parse_keep_alive(value) if plain else value

    @property
    def option_defaults(self) -> dict[str, Any]:
        """Defaults under every request's options."""
        return {"num_ctx": self.context_length, "tensor_parallel": self.tensor_parallel}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "LocalSettings":
        """From the variables in ``env`` (``os.environ`` when None), then ``overrides`` (flags)."""
        values, found_in = read_env(cls, _environ(env))
        given = {k: v for k, v in overrides.items() if v is not None}
        values.update(given)
        return validated(cls, values, {k: v for k, v in found_in.items() if k not in given})


SPECULATIVE_METHODS = ("ngram", "draft")
SPECULATIVE_SWITCHES = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False, "none": False}


def check_speculative(value: Any) -> Any:
    """A ``speculative`` setting: a method (``ngram``, ``ngram:k=4``, ``draft:MODEL:k=4``), on/off, or None.
    The engine parses the options (``native_engine.spec_decode.config``); this checks the shape at start."""
    if value is None or isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise ValueError(f"speculative must be a string such as 'ngram:k=4', got {value!r}")
    text = value.strip()
    if text.lower() in SPECULATIVE_SWITCHES:
        return text.lower()
    method = text.partition(":")[0].lower()
    if method not in SPECULATIVE_METHODS or (method == "draft" and not text.partition(":")[2]):
        raise ValueError(f"speculative must be ngram[:k=N], draft:MODEL[:k=N], on or off; got {value!r}")
    return text


def speculative_switch(value: Any) -> bool | None:
    """A request's ``speculative``: True (a method, or on), False (off), None (unset: the model's setting)."""
    if value is None or isinstance(value, bool):
        return value
    return SPECULATIVE_SWITCHES.get(str(value).strip().lower(), True)


DEFAULTS = LocalSettings.model_construct()  # the defaults, for code that has no settings at hand


# -- infer serve ---------------------------------------------------------------------------------


class ServerSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str = Field(default=DEFAULT_HOST, json_schema_extra=env("INFER_HOST", "OLLAMA_HOST",
                                                                   shown=f"`{DEFAULT_HOST}:{DEFAULT_PORT}`"),
                      description="Where `infer serve` binds, and where `infer run`/`ps`/`stop`/`-v` look for it: "
                                  "`[scheme://]host[:port]` — Ollama's forms `0.0.0.0` (port 11434), `host:port`, "
                                  "`http://host:port`, `:port` (on 127.0.0.1 here; Ollama binds every interface for "
                                  "it)")
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535, description="Port to bind (from INFER_HOST).")
    origins: tuple[str, ...] = Field(default=(), json_schema_extra=env("INFER_ORIGINS", "OLLAMA_ORIGINS", shown="—"),
                                     description="Extra allowed CORS origins, comma-separated, `*` wildcards (e.g. "
                                                 "`chrome-extension://*`)")
    api_key_hashes: frozenset[str] = Field(default=frozenset(), json_schema_extra=env("INFER_API_KEYS", shown="—"),
                                           description="Comma-separated operator keys; when set, auth is on: every "
                                                       "route but the public ones needs a key (*Who may call what*)")
    local: LocalSettings = Field(default_factory=lambda: DEFAULTS, description="The in-process engines.")
    config: Path | None = Field(default=None, json_schema_extra=env("INFER_CONFIG", shown="—"),
                                description="Remote backends file for `infer serve` and `infer backends check` (same "
                                            "as `--config`)")
    max_body_bytes: int = Field(default=32 << 20, ge=1024,
                                json_schema_extra=env("INFER_MAX_BODY_BYTES", shown="32 MiB"),
                                description="Largest request body any route takes: 413 before it is read")
    max_prompt_bytes: int = Field(default=8 << 20, ge=1024,
                                  json_schema_extra=env("INFER_MAX_PROMPT_BYTES", shown="8 MiB"),
                                  description="Largest body a prompt route takes (chat, completions, messages, "
                                              "count_tokens, responses, generate): 413 before it is read (*Limits and "
                                              "guarantees*)")
    max_messages: int = Field(default=10_000, ge=1, json_schema_extra=env("INFER_MAX_MESSAGES"),
                              description="Most messages (or Responses input items) in one request: 413 before any "
                                          "work")
    max_tools: int = Field(default=512, ge=1, json_schema_extra=env("INFER_MAX_TOOLS"),
                           description="Most tools in one request: 413 before any work")
    max_blob_bytes: int = Field(default=256 << 30, ge=1, json_schema_extra=env("INFER_MAX_BLOB_BYTES", shown="256 GiB"),
                                description="Largest model file `/api/blobs` accepts; free disk space less 1 GiB caps "
                                            "it too (413)")
    redis_url: str | None = Field(default=None, json_schema_extra=env("INFER_REDIS_URL", shown="—"),
                                  description="Redis for per-key rate limits shared by replicas (`--redis-url`); in "
                                  "process memory without it")
    hold_ttl_s: float = Field(default=60.0, ge=1.0, json_schema_extra=env("INFER_HOLD_TTL_S"),
                              description="Seconds a budget hold outlives its last renewal (a dead replica's holds go "
                                          "back after this)")
    shutdown_grace: float = Field(default=5.0, ge=0.0, json_schema_extra=env("INFER_SHUTDOWN_GRACE"),
                                  description="Seconds running requests get to finish after SIGTERM/SIGINT; the rest "
                                  "then end with an error event and their ledger row")
    database_url: str = Field(description="Usage ledger URL: --db, else the registry settings' INFER_DATABASE_URL.")
    responses_retention: float = Field(default=30 * 86400.0, ge=0.0,
                                       json_schema_extra=env("INFER_RESPONSES_RETENTION", shown="`720h`"),
                                       description="How long `/v1/responses` answers stored for "
                                                   "`previous_response_id` stay readable (a duration or seconds; `0` "
                                                   "stores none)")
    registry: RegistrySettings

    @field_validator("origins", mode="before")
    @classmethod
    def _origins(cls, value: Any) -> Any:
        items = value.split(",") if isinstance(value, str) else value
        return tuple(o.strip() for o in items if o.strip())

    @field_validator("api_key_hashes", mode="before")
    @classmethod
    def _hashes(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        return frozenset(hashlib.sha256(k.strip().encode("utf-8")).hexdigest() for k in value.split(",") if k.strip())

    @field_validator("responses_retention", mode="before")
    @classmethod
    def _retention(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str) else value

    @field_validator("config", mode="after")
    @classmethod
    def _config(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

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
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "ServerSettings":
        """From the variables in ``env`` (``os.environ`` when None), then ``overrides`` (``infer serve``'s
        flags; the engine ones go to ``local``)."""
        env = _environ(env)
        registry = RegistrySettings.from_env(env)
        local = LocalSettings.from_env(env, **{k: overrides.pop(k) for k in list(overrides)
                                               if k in LocalSettings.model_fields})
        values, found_in = read_env(cls, env)
        if "host" in values:
            values["host"], values["port"] = parse_host(values["host"], found_in["host"])
        values.update(registry=registry, local=local, database_url=registry.database_url)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return validated(cls, values, {k: v for k, v in found_in.items() if overrides.get(k) is None})


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


def host_from_env(env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """The address ``infer serve`` binds: INFER_HOST, else OLLAMA_HOST, else 127.0.0.1:11434."""
    found = env_value(_environ(env), variables_of(ServerSettings.model_fields["host"]))
    return parse_host(found[1], found[0]) if found else (DEFAULT_HOST, DEFAULT_PORT)


def client_url(env: Mapping[str, str] | None = None) -> str:
    """Where the CLI finds ``infer serve`` (or Ollama): the bound address, a wildcard read as loopback."""
    return loopback_url(*host_from_env(env))


def loopback_url(host: str, port: int) -> str:
    """``http://host:port`` for a client, a wildcard address read as loopback (as Ollama's clients do)."""
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def config_file(env: Mapping[str, str] | None = None) -> Path | None:
    """``INFER_CONFIG`` alone (``infer cost``, ``infer backends``), without the rest of the server's tree."""
    found = env_value(_environ(env), variables_of(ServerSettings.model_fields["config"]))
    return Path(found[1]).expanduser() if found else None


# -- the CLI as a client -------------------------------------------------------------------------


class ClientSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    api_key: str | None = Field(default=None, json_schema_extra=env("INFER_API_KEY", shown="—"),
                                description="The key `infer run`/`ps`/`stop` send to a server that has "
                                            "`INFER_API_KEYS`")
    local: bool = Field(default=False, json_schema_extra=env("INFER_LOCAL"),
                        description="`1`: `infer run` always runs in its own process (same as `--local`)")
    raise_errors: bool = Field(default=False, json_schema_extra=env("INFER_RAISE_ERRORS"),
                               description="Show Python tracebacks instead of one-line errors (debugging)")

    _flags = field_validator("local", "raise_errors", mode="before")(classmethod(lambda cls, value: _flag(value)))

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ClientSettings":
        return validated(cls, *read_env(cls, _environ(env)))


# -- the README's table --------------------------------------------------------------------------

TREE = (("where things live", RegistrySettings), ("local engines", LocalSettings), ("infer serve", ServerSettings),
        ("the CLI", ClientSettings))


def env_fields() -> list[tuple[str, str, Any]]:
    """``(group, field name, field)`` of every environment-backed field, in the tree's order."""
    return [(group, name, field) for group, cls in TREE for name, field in cls.model_fields.items()
            if variables_of(field)]


def shown_default(field: Any) -> str:
    if "shown" in field.json_schema_extra:
        return field.json_schema_extra["shown"]
    value = field.default
    if isinstance(value, bool) or value is None:
        return {True: "on", False: "off", None: "—"}[value]
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def env_table() -> str:
    """The README's table of variables: one row per environment-backed field."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for _, _, field in env_fields():
        first, *others = variables_of(field)
        name = f"`{first}`" + (f" (`{'`, `'.join(others)}`)" if others else "")
        rows.append(f"| {name} | {shown_default(field)} | {field.description} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(env_table())
