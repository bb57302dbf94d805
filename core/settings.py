"""Settings of the in-process engines: one typed tree, each default written once.

``infer serve`` (``gateway.settings.ServerSettings.local``) and ``infer run`` read the same
``INFER_*`` variables through :meth:`LocalSettings.from_env`; the llama.cpp pool, the native
engine and the option defaults (``num_ctx``) all derive from it. Where ``INFER_X`` is unset,
Ollama's ``OLLAMA_X`` is read (``registry.settings.env_setting``); ``OLLAMA_MAX_LOADED_MODELS=0``
means "auto" to Ollama, so it keeps the default here (``INFER_MAX_LOADED_MODELS=0`` = no limit).

| variable (Ollama's) | field | default |
|---|---|---|
| ``INFER_ENGINE`` | ``engine`` | ``llamacpp`` |
| ``INFER_KEEP_ALIVE`` (``OLLAMA_KEEP_ALIVE``) | ``keep_alive`` | ``5m`` (300 s; ``-1`` = forever, ``0`` = unload when idle) |
| ``INFER_NUM_PARALLEL`` (``OLLAMA_NUM_PARALLEL``) | ``num_parallel`` | ``1`` |
| ``INFER_MAX_QUEUE`` (``OLLAMA_MAX_QUEUE``) | ``max_queue`` | ``512`` |
| ``INFER_MAX_LOADED_MODELS`` (``OLLAMA_MAX_LOADED_MODELS``) | ``max_loaded_models`` | ``3`` |
| ``INFER_CONTEXT_LENGTH`` (``OLLAMA_CONTEXT_LENGTH``) | ``context_length`` | ``2048`` |
| ``INFER_LOAD_TIMEOUT`` (``OLLAMA_LOAD_TIMEOUT``) | ``load_timeout`` | ``5m``: a runner not loaded by then is killed |
| ``INFER_HANG_TIMEOUT`` | ``hang_timeout`` | ``5m``: a runner with work that sends no event for this long is killed |
| ``INFER_TEST_ENGINE`` | ``test_engine`` | off: ``1`` offers the ``scripted`` engine (tests, benches) |
| ``INFER_SPECULATIVE`` | ``speculative`` | off (``ngram:k=4``, ``draft:MODEL:k=4``; native engine) |
| ``INFER_TENSOR_PARALLEL`` | ``tensor_parallel`` | ``1``: ranks a native model is split over |
| ``INFER_KV_ROLE`` (``infer serve --role``) | ``kv_role`` | ``both``: prefill and decode legs (``prefill``, ``decode``) |
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.durations import parse_keep_alive
from registry.settings import env_setting

ENV_PREFIX = "INFER_"


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
    # Where the ranks of a tensor-parallel group meet, when the gateway started them (the runner starter
    # sets it for the group it launches; None: an engine starts its own ranks).
    distributed_init_method: str | None = None

    def given(self) -> dict[str, Any]:
        """The knobs set (the rest are the engine's defaults)."""
        return self.model_dump(exclude_none=True)


class LocalSettings(BaseSettings):
    model_config = SettingsConfigDict(frozen=True, env_prefix=ENV_PREFIX, extra="ignore")

    engine: Literal["llamacpp", "native", "scripted"] = Field(
        default="llamacpp", description="In-process engine for store models; a request may name another.")
    keep_alive: float = Field(default=300.0, description="Seconds an idle model stays loaded (-1 = forever).")
    num_parallel: int = Field(default=1, ge=1, le=64, description="Concurrent requests per llama.cpp model.")
    max_queue: int = Field(default=512, ge=0, description="Requests waiting per model before 503.")
    max_loaded_models: int = Field(default=3, ge=0, description="Models kept loaded at once.")
    context_length: int = Field(default=2048, ge=16, le=1 << 20,
                                description="num_ctx when neither the model nor the request sets one.")
    load_timeout: float = Field(default=300.0, gt=0, description="Seconds a runner may take to load its model.")
    hang_timeout: float = Field(default=300.0, gt=0,
                                description="Seconds a runner with requests in flight may go without an event.")
    test_engine: bool = Field(default=False, description="Offer the model-less 'scripted' engine (tests, benches).")
    tensor_parallel: int = Field(default=1, ge=1, le=64,
                                 description="Ranks each native model is split over (tensor parallelism); a "
                                 "Modelfile's PARAMETER tensor_parallel or a request's option overrides it.")
    native: NativeSettings = Field(default_factory=NativeSettings)
    kv_role: Literal["prefill", "decode", "both"] = Field(
        default="both", description="The native engine's part in prefill/decode disaggregation (vLLM's kv_role): "
        "prefill refuses decode legs, decode refuses prefill legs, both takes either; plain requests always.")
    speculative: str | None = Field(
        default=None, description="Speculative decoding in the native engine: ngram[:k=4], draft:MODEL[:k=4] or "
        "off; a model's Modelfile 'PARAMETER speculative' overrides it, a request's 'speculative' turns it off/on.")

    @field_validator("speculative", mode="before")
    @classmethod
    def _speculative(cls, value: Any) -> Any:
        return check_speculative(value)

    @field_validator("keep_alive", "load_timeout", "hang_timeout", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return parse_keep_alive(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else value

    @property
    def option_defaults(self) -> dict[str, Any]:
        """Defaults under every request's options."""
        return {"num_ctx": self.context_length, "tensor_parallel": self.tensor_parallel}

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: Any) -> "LocalSettings":
        """From ``INFER_*`` in ``env`` (not ``os.environ``), then ``overrides``; ValueError names the variable."""
        values: dict[str, Any] = {}
        variables: dict[str, str] = {}
        for name in ("engine", "keep_alive", "num_parallel", "max_queue", "max_loaded_models", "context_length",
                     "load_timeout", "hang_timeout", "test_engine", "speculative", "tensor_parallel", "kv_role"):
            found = env_setting(env, name.upper(), ollama=name not in ("engine", "hang_timeout", "test_engine",
                                                                      "speculative", "tensor_parallel", "kv_role"))
            if found and found != ("OLLAMA_MAX_LOADED_MODELS", "0"):  # Ollama's 0 = auto: our default
                variables[name], values[name] = found
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            name = str(err["loc"][0]) if err["loc"] else "settings"
            var = variables[name] if name in variables and name not in overrides else name
            raise ValueError(f"invalid {var}: {err['msg']}") from None


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
