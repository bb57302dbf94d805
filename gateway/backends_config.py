"""The ``infer serve --config FILE.yaml`` file: remote backends, validated, with errors that point at a line.

    config = load_config("backends.yaml")          # ConfigError: "backends.yaml:7: backends[1].type: ..."
    settings = config.remote_settings()            # list[RemoteSettings], api keys read from the env

Schema: ``.notes/remote-design.md``. ``routes``, ``slos`` and ``pricing`` are reserved top-level
keys (the router's issue); they are accepted and ignored here. Any other unknown key is an error.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (BaseModel, ConfigDict, Discriminator, Field, PositiveFloat, PrivateAttr, Tag, ValidationError,
                      ValidationInfo, field_validator)

from adapters.engines.local import ENGINES
from adapters.remote.base import RemoteSettings, Timeouts
from adapters.remote.registry import OPENAI_TYPES, REMOTE_TYPES

from core.settings import SettingsError
from pricing.catalog import LOCAL, Priced

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ConfigError(SettingsError):
    """The config file is unusable: ``file:line: field.path: what is wrong``. A SettingsError (so a ValueError),
    so ``cli.main`` prints it as one line."""


class TimeoutMap(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    connect: PositiveFloat | None = None
    first_byte: PositiveFloat | None = None
    read: PositiveFloat | None = None
    total: PositiveFloat | None = None


# A number (total seconds) or a mapping; tagged so a bad mapping key is reported as that key.
def _timeout_kind(value: Any) -> str | None:
    if isinstance(value, (dict, TimeoutMap)):
        return "mapping"
    return "seconds" if isinstance(value, (int, float)) and not isinstance(value, bool) else None


TimeoutField = Annotated[Annotated[PositiveFloat, Tag("seconds")] | Annotated[TimeoutMap, Tag("mapping")],
                         Discriminator(_timeout_kind, custom_error_type="timeout", custom_error_message=(
                             "expected seconds or a mapping of connect, first_byte, read, total"))]
_UNION_TAGS = {"seconds", "mapping"}


def plain_name(value: str) -> str:
    """A backend's or a route's name: what clients send as ``model``."""
    if not value or any(c.isspace() for c in value):
        raise ValueError("must be a non-empty name without spaces")
    return value


class PricingEntry(BaseModel):
    """List prices per million tokens (an API), or a self-hosted bill per hour divided over the
    tokens that used it (``pricing/``): one of the two forms."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_per_mtok: float | None = Field(default=None, ge=0)
    output_per_mtok: float | None = Field(default=None, ge=0)
    cached_input_per_mtok: float | None = Field(default=None, ge=0)
    gpu_hourly_usd: float | None = Field(default=None, ge=0)
    gpus: float = Field(default=1.0, gt=0)
    output_weight: float | Literal["measured"] = 5.0
    cached_input_weight: float | Literal["measured"] = 0.1
    window_s: PositiveFloat = 3600.0

    @field_validator("output_weight")
    @classmethod
    def _weight(cls, value: float | str) -> float | str:
        if not isinstance(value, str) and value <= 0:
            raise ValueError("must be > 0, or 'measured'")
        return value

    @field_validator("cached_input_weight")
    @classmethod
    def _cached_weight(cls, value: float | str) -> float | str:
        if not isinstance(value, str) and value < 0:
            raise ValueError("must be >= 0, or 'measured'")
        return value

    def model_post_init(self, _context: Any) -> None:
        listed = self.input_per_mtok is not None or self.output_per_mtok is not None
        if listed == (self.gpu_hourly_usd is not None):
            raise ValueError("give list prices (input_per_mtok, output_per_mtok) or a self-hosted bill "
                             "(gpu_hourly_usd, gpus), one of the two")
        if listed and (self.input_per_mtok is None or self.output_per_mtok is None):
            raise ValueError("list prices need both input_per_mtok and output_per_mtok")


class LocalEntry(BaseModel):
    """The in-process engines on this machine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pricing: PricingEntry | None = None


class LoraModuleEntry(BaseModel):
    """A LoRA adapter the backend serves (vLLM's ``--lora-modules name=path``): a model name of its own,
    sent to the backend as the request's ``model``, listed with the backend as its ``parent``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    model: str | None = None  # the backend's name for the adapter; default: name
    pricing: PricingEntry | None = None  # default: the backend's (one bill for the base and its adapters)

    _name = field_validator("name")(classmethod(lambda cls, value: plain_name(value)))


class BackendEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    type: str
    base_url: str
    model: str | None = Field(default=None, validate_default=True)
    api_key_env: str | None = None
    timeout: TimeoutField | None = None
    max_inflight: int | None = Field(default=None, ge=1)
    tokenizer: str | None = None
    mode: Literal["generate", "messages"] | None = None
    context_length: int | None = Field(default=None, gt=0)
    pricing: PricingEntry | None = None
    kv_events: str | None = None       # the backend's KV cache event stream (vLLM --kv-events-config): precise routing
    kv_events_topic: str = ""
    lora_modules: list[LoraModuleEntry] = Field(default_factory=list)

    _name = field_validator("name")(classmethod(lambda cls, value: plain_name(value)))

    @field_validator("lora_modules")
    @classmethod
    def _lora_modules(cls, value: list[LoraModuleEntry], info: ValidationInfo) -> list[LoraModuleEntry]:
        kind = info.data.get("type")
        if value and kind is not None and kind not in OPENAI_TYPES:
            raise ValueError(f"LoRA adapters are passed through to OpenAI-compatible servers "
                             f"({', '.join(sorted(OPENAI_TYPES))}), not {kind}")
        return value

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        if value not in REMOTE_TYPES:
            raise ValueError(f"unknown type '{value}' (choose one of {', '.join(REMOTE_TYPES)})")
        return value

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str, info: ValidationInfo) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"'{value}' is not an http(s) URL; use http://host:port")
        url = value.strip().rstrip("/")
        kind = info.data.get("type")
        if url.endswith("/v1") and kind is not None:
            if kind not in OPENAI_TYPES:
                raise ValueError(f"give the server root for type {kind}, without /v1 (a trailing /v1 is only "
                                 f"accepted for {', '.join(sorted(OPENAI_TYPES))})")
            url = url[:-3].rstrip("/")
        return url

    @field_validator("model")
    @classmethod
    def _model(cls, value: str | None, info: ValidationInfo) -> str | None:
        kind = info.data.get("type")
        if value is None and kind == "triton":
            return "ensemble"
        if not value and kind is not None:
            raise ValueError(f"required for type {kind}: the backend's own model name")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.fullmatch(value):
            raise ValueError(f"'{value}' is not an environment variable name")
        return value

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        path = Path(value).expanduser()
        if not path.is_absolute():
            path = Path((info.context or {}).get("base_dir", ".")) / path
        if not path.is_file():
            raise ValueError(f"tokenizer file {path} not found")
        return str(path.resolve())

    @field_validator("kv_events")
    @classmethod
    def _kv_events(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if not value.startswith(("tcp://", "ipc://")):
            raise ValueError(f"'{value}' is not a ZMQ endpoint; use tcp://host:port (vLLM's kv-events endpoint)")
        if not info.data.get("tokenizer"):
            raise ValueError("needs tokenizer: (the backend's tokenizer.json or .gguf) to match prompts to the "
                             "token blocks the events name")
        return value

    @field_validator("mode")
    @classmethod
    def _mode(cls, value: str | None, info: ValidationInfo) -> str | None:
        kind = info.data.get("type")
        if value is not None and kind is not None and kind != "tgi":
            raise ValueError(f"only the tgi type has a mode (this entry is {kind})")
        return value

    def timeouts(self) -> Timeouts:
        """A number is the total; first_byte and read never exceed it."""
        default = Timeouts()
        if self.timeout is None:
            return default
        if isinstance(self.timeout, TimeoutMap):
            return Timeouts(**{k: v for k, v in self.timeout.model_dump().items() if v is not None})
        total = float(self.timeout)
        return Timeouts(connect=min(default.connect, total), first_byte=min(default.first_byte, total),
                        read=min(default.read, total), total=total)


class SLOEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_ms: PositiveFloat | None = None
    tpot_ms: PositiveFloat | None = None
    e2e_ms: PositiveFloat | None = None
    target: float = Field(default=0.95, gt=0, le=1)
    window_s: PositiveFloat = 300.0


class PrefixEntry(BaseModel):
    """The route's prefix index (``routing/prefix.py``), for ``strategy: prefix`` and ``slo``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    block_chars: int = Field(default=128, ge=16, le=4096, description="Characters of rendered prompt per hashed block.")
    max_blocks: int = Field(default=512, ge=1, le=1 << 16, description="Blocks of a prompt looked at (64 KiB of "
                            "text at 128 characters a block); two prompts alike that far are not told apart.")
    capacity_tokens: int = Field(default=500_000, ge=1, description="A backend's KV cache in tokens, when it "
                                 "does not report its own (vLLM's cache_config_info).")
    load_factor: float = Field(default=1.25, ge=1.0, description="Bounded loads: a backend takes at most this "
                               "times the mean in flight (rounded up).")
    load_slack: int = Field(default=2, ge=0, description="... plus this many requests.")
    min_match: float = Field(default=0.0, ge=0.0, le=1.0, description="A match below this share of the prompt "
                             "counts as none.")


class PoolEntry(BaseModel):
    """A route's prefill or decode pool (``routing/disagg.py``): backends speaking one P/D protocol."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    protocol: Literal["vllm", "sglang"] = Field(description="vllm: kv_transfer_params (NIXL and the other KV "
                                                "connectors); sglang: bootstrap_host/port/room.")
    backends: list[str] = Field(min_length=1)
    bootstrap_port: int = Field(default=8998, ge=1, le=65535, description="sglang prefill servers' "
                                "--disaggregation-bootstrap-port.")


class DisaggEntry(BaseModel):
    """When a route with P/D pools disaggregates a request (``routing/disagg.py``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    when: Literal["always", "long", "slo"] = Field(default="slo", description="always; long: the uncached "
                                                   "prompt is over threshold_tokens; slo: that, and the decode "
                                                   "worker's TPOT would break the SLO otherwise.")
    threshold_tokens: int = Field(default=512, ge=0, description="Uncached prompt tokens a request needs to be "
                                  "prefilled elsewhere.")
    prefill_timeout_ms: PositiveFloat = Field(default=30_000, description="The prefill leg's deadline; past it "
                                              "the request is served co-located.")


class RouteEntry(BaseModel):
    """A public model name in front of several backends, with a latency SLO (``routing/``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    backends: list[str] = Field(default_factory=list)  # co-located; may be empty with prefill and decode pools
    prefill: PoolEntry | None = None
    decode: PoolEntry | None = None
    disagg: DisaggEntry = Field(default_factory=DisaggEntry)
    strategy: Literal["slo", "least_inflight", "round_robin", "weighted", "prefix"] = "slo"
    slo: SLOEntry = Field(default_factory=SLOEntry)  # left out: no latency targets
    prefix: PrefixEntry = Field(default_factory=PrefixEntry)
    shed: bool = False
    first_token_timeout_ms: PositiveFloat | None = None
    retries: int = Field(default=1, ge=0, le=10)
    fallbacks: list[str] = Field(default_factory=list)
    weights: dict[str, PositiveFloat] = Field(default_factory=dict)

    _name = field_validator("name")(classmethod(lambda cls, value: plain_name(value)))

    @property
    def members(self) -> list[str]:
        """Every backend the route names: co-located, prefill and decode, once each."""
        pools = [*(self.prefill.backends if self.prefill else []), *(self.decode.backends if self.decode else [])]
        return list(dict.fromkeys([*self.backends, *pools]))


class AuthEntry(BaseModel):
    """Who may call the server (``gateway/policy/access.py``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    required: bool = False  # every API request needs an API key (infer keys create); loopback included
    public_metrics: bool = False  # GET /metrics answers without a key (a Prometheus without a bearer)
    public_docs: bool = False  # GET /openapi.json answers without a key
    rate_limits_fail_open: bool = False  # Redis down: keyed requests go on without rpm/tpm (else 503)

    def public(self) -> tuple[str, ...]:
        return tuple(name for name, on in (("metrics", self.public_metrics), ("docs", self.public_docs)) if on)


class GatewayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backends: list[BackendEntry] = Field(default_factory=list)
    routes: list[RouteEntry] = Field(default_factory=list)
    local: LocalEntry | None = None
    auth: AuthEntry = Field(default_factory=AuthEntry)

    def priced(self, home: Path | None = None) -> list[Priced]:
        """Each pricing entry with the ledger's backend names it prices and its output weight
        (``measured``: from the latest ``infer bench`` run under ``home``). ``local`` prices the
        in-process engines and the route members that are models of the local store, as one bill."""
        out = [Priced.of(e.name, e.pricing, (e.name, *(m.name for m in e.lora_modules if m.pricing is None)),
                         home=home, address=(e.base_url, e.model or ""))
               for e in self.backends if e.pricing is not None]
        out += [Priced.of(m.name, m.pricing, home=home, address=(e.base_url, m.model or m.name))
                for e in self.backends for m in e.lora_modules if m.pricing is not None]
        if self.local is not None and self.local.pricing is not None:
            out.append(Priced.of(LOCAL, self.local.pricing, (*ENGINES, *self.local_models()), home=home))
        return out

    def kv_event_sources(self) -> dict[str, Any]:
        """The backends that publish their KV cache (``kv_events:``), for the routes' precise index."""
        from routing.kv_events import KVEventSource

        return {e.name: KVEventSource(e.name, e.kv_events, e.tokenizer or "", e.kv_events_topic)
                for e in self.backends if e.kv_events}

    def local_models(self) -> list[str]:
        """Route members that are not backends of this file: models of the local store."""
        backends = {entry.name for entry in self.backends} | {m.name for e in self.backends for m in e.lora_modules}
        return list(dict.fromkeys(n for route in self.routes for n in route.members if n not in backends))

    _source: str | None = PrivateAttr(default=None)
    _root: yaml.Node | None = PrivateAttr(default=None)

    def remote_settings(self, env: Mapping[str, str] = os.environ) -> list[RemoteSettings]:
        """Each backend, then each of its LoRA adapters as a backend of its own (the same server; the
        adapter's name as the model; the backend as its parent)."""
        out = []
        for i, entry in enumerate(self.backends):
            base = self._settings(i, entry, env)
            out.append(base)
            out += [dataclasses.replace(base, name=m.name, model=m.model or m.name, parent=entry.name)
                    for m in entry.lora_modules]
        return out

    def _settings(self, index: int, entry: BackendEntry, env: Mapping[str, str]) -> RemoteSettings:
        api_key = None
        if entry.api_key_env:
            api_key = env.get(entry.api_key_env)
            if not api_key:
                state = "is empty" if entry.api_key_env in env else "is not set"
                raise ConfigError(self.where(("backends", index, "api_key_env"))
                                  + f"environment variable {entry.api_key_env} {state}")
        return RemoteSettings(name=entry.name, type=entry.type, base_url=entry.base_url, model=entry.model or "",
                              api_key=api_key, timeouts=entry.timeouts(), max_inflight=entry.max_inflight,
                              tokenizer=entry.tokenizer, mode=entry.mode, context_length=entry.context_length)

    def where(self, loc: tuple[Any, ...]) -> str:
        """``file:line: field.path: `` for a field (file and line only when loaded from a file)."""
        line = f"{self._source}:{line_of(self._root, loc)}: " if self._source else ""
        return f"{line}{field_path(loc)}: "


def load_config(path: str | os.PathLike[str]) -> GatewayConfig:
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {source} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {source}: {exc}") from None
    root, data = _parse(source, text)
    if data is None:
        raise ConfigError(f"{source}: the file is empty; it needs a 'backends:' list")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:{line_of(root, ())}: the top level must be a mapping with a 'backends:' list")
    try:
        config = GatewayConfig.model_validate(data, context={"base_dir": Path(path).parent})
    except ValidationError as exc:
        err = min(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")  # a typo explains a "missing"
        raise ConfigError(f"{source}:{line_of(root, err['loc'])}: {field_path(err['loc'])}: {_reason(err)}") from None
    config._source, config._root = source, root
    _check_unique_names(config)
    _check_routes(config)
    return config


def _parse(source: str, text: str) -> tuple[yaml.Node | None, Any]:
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        return root, (loader.construct_document(root) if root is not None else None)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise ConfigError(f"{source}:{line}: invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def _check_unique_names(config: GatewayConfig) -> None:
    seen: dict[str, str] = {}
    for i, entry in enumerate(config.backends):
        named = [(("backends", i, "name"), entry.name, f"backends[{i}]")]
        named += [(("backends", i, "lora_modules", j, "name"), m.name, f"backends[{i}].lora_modules[{j}]")
                  for j, m in enumerate(entry.lora_modules)]
        for loc, name, where in named:
            if name in seen:
                raise ConfigError(config.where(loc) + f"duplicate name '{name}' ({seen[name]} has it too)")
            seen[name] = where


def _check_routes(config: GatewayConfig) -> None:
    """Route names are new model names; fallbacks name routes; weights name the route's backends.
    A backend name that is not in ``backends:`` is taken as a model of the local store."""
    if not config.backends and not config.routes:
        raise ConfigError(f"{config._source}: the file needs a 'backends:' or a 'routes:' list")
    backends = {entry.name for entry in config.backends} | {m.name for e in config.backends for m in e.lora_modules}
    routes = {route.name: i for i, route in enumerate(config.routes)}
    for i, route in enumerate(config.routes):
        if route.name in backends:
            raise ConfigError(config.where(("routes", i, "name")) + f"'{route.name}' is already a backend's name")
        if routes[route.name] != i:
            raise ConfigError(config.where(("routes", i, "name")) + f"duplicate route '{route.name}'")
        for j, name in enumerate(route.fallbacks):
            if name not in routes or name == route.name:
                raise ConfigError(config.where(("routes", i, "fallbacks", j))
                                  + f"'{name}' is not another route of this file")
        for name in route.weights:
            if name not in route.backends:
                raise ConfigError(config.where(("routes", i, "weights", name))
                                  + f"'{name}' is not one of this route's backends")
        _check_pools(config, i, route)


def _check_pools(config: GatewayConfig, i: int, route: RouteEntry) -> None:
    """A route serves something (backends, or both pools); the pools come in pairs, speak one protocol,
    and a pool's members are remote backends speaking the OpenAI API (the legs are OpenAI bodies plus
    the P/D fields)."""
    if (route.prefill is None) != (route.decode is None):
        missing = "decode" if route.decode is None else "prefill"
        raise ConfigError(config.where(("routes", i)) + f"a prefill pool needs a decode pool and back: add {missing}:")
    if route.prefill is None or route.decode is None:
        if not route.backends:
            raise ConfigError(config.where(("routes", i, "backends")) + "the list is empty; add at least one "
                              "backend, or prefill: and decode: pools")
        return
    if route.prefill.protocol != route.decode.protocol:
        raise ConfigError(config.where(("routes", i, "decode", "protocol")) + f"'{route.decode.protocol}' differs "
                          f"from the prefill pool's '{route.prefill.protocol}'; both legs speak one protocol")
    types = {entry.name: entry.type for entry in config.backends}
    for pool in ("prefill", "decode"):
        for j, name in enumerate(getattr(route, pool).backends):
            kind = f"a {types[name]} backend" if name in types else "not a backend of this file"
            if types.get(name) not in OPENAI_TYPES:
                raise ConfigError(config.where(("routes", i, pool, "backends", j)) + f"'{name}' is {kind}; a P/D "
                                  f"pool takes OpenAI-compatible servers ({', '.join(sorted(OPENAI_TYPES))}) of "
                                  "backends: (a native worker is an infer serve --role prefill|decode)")


def _reason(err: dict[str, Any]) -> str:
    kind = err["type"]
    if kind == "value_error":
        return str(err["ctx"]["error"])
    if kind in ("model_type", "dict_type"):
        return "expected a mapping of key: value lines"
    if kind == "extra_forbidden":
        known = [*GatewayConfig.model_fields, *BackendEntry.model_fields, *TimeoutMap.model_fields,
                 *RouteEntry.model_fields, *SLOEntry.model_fields, *PricingEntry.model_fields,
                 *PoolEntry.model_fields, *DisaggEntry.model_fields,
                 *PrefixEntry.model_fields, *LoraModuleEntry.model_fields,
                 *AuthEntry.model_fields]
        close = difflib.get_close_matches(str(err["loc"][-1]), known, n=1)
        return "unknown key" + (f" (did you mean '{close[0]}'?)" if close else "")
    if kind == "missing":
        return "required field is missing"
    if kind == "too_short" and err["loc"] == ("backends",):
        return "the list is empty; add at least one backend"
    return err["msg"]


def _clean(loc: tuple[Any, ...]) -> list[Any]:
    """``loc`` without the tags pydantic adds for the timeout union."""
    return [part for i, part in enumerate(loc) if not (part in _UNION_TAGS and i and loc[i - 1] == "timeout")]


def field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in _clean(loc):
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out or "(top level)"


def line_of(root: yaml.Node | None, loc: tuple[Any, ...]) -> int:
    """1-based line of the node ``loc`` names, or of the deepest mapping/list on the way (a missing key)."""
    if root is None:
        return 1
    node, line = root, root.start_mark.line + 1
    for part in _clean(loc):
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == part), None)
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line
