"""Target specs as the user writes them, and the target each one opens.

    MODEL@ENGINE[?key=value&...]     a store model (or a .gguf path) on an in-process engine:
                                     smollm2:135m@native, smollm2:135m@llamacpp,
                                     'smollm2:135m@native?dtype=float32&cpu_int4_matmul=false'
    URL#MODEL                        a server: http://host:port#model (OpenAI API, /v1/completions),
                                     http://host:port/api#model (Ollama API, /api/generate);
                                     ?key_env=NAME sends the key in that environment variable
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from .target import Target, TargetError, TargetInfo

ENGINES = ("native", "llamacpp")


def open_target(spec: str, store=None) -> Target:
    """The target ``spec`` names, loaded and ready (an engine loads its model here)."""
    if spec.startswith(("http://", "https://")):
        return _server(spec)
    return _engine(spec, store)


def _server(spec: str) -> Target:
    from .remote import OllamaTarget, OpenAITarget

    parts = urlsplit(spec)
    model = parts.fragment
    if not model:
        raise TargetError(f"{spec}: name the model after '#', e.g. http://127.0.0.1:8000#my-model")
    options = dict(parse_qsl(parts.query))
    unknown = sorted(set(options) - {"key_env"})
    if unknown:
        raise TargetError(f"{spec}: unknown option {unknown[0]!r}; a server takes key_env=NAME")
    path = parts.path.rstrip("/")
    if path not in ("", "/v1", "/api"):
        raise TargetError(f"{spec}: the path must be empty or /v1 (OpenAI API) or /api (Ollama API), not {path!r}")
    base = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    kind = "ollama" if path == "/api" else "openai"
    info = TargetInfo(spec, kind, model, {"api": kind, "url": base})
    cls = OllamaTarget if kind == "ollama" else OpenAITarget
    return cls(info, base, model, options.get("key_env"))


def split_engine_spec(spec: str) -> tuple[str, str, dict[str, str]]:
    """``name@engine?k=v`` -> (name, engine, options)."""
    name, at, rest = spec.rpartition("@")
    if not at or not name:
        raise TargetError(f"{spec}: say which engine runs it: {spec}@native or {spec}@llamacpp "
                          "(or give a server URL: http://host:port#model)")
    engine, _, query = rest.partition("?")
    if engine not in ENGINES:
        raise TargetError(f"{spec}: unknown engine {engine!r}; choose {' or '.join(ENGINES)}")
    return name, engine, dict(parse_qsl(query, keep_blank_values=True))


def _engine(spec: str, store) -> Target:
    from .engines import LlamaCppTarget, NativeTarget

    name, engine, options = split_engine_spec(spec)
    path = _model_path(name, store)
    info = TargetInfo(spec, engine, name, {"file": path.name} if path.name.endswith(".gguf") else {})
    return (NativeTarget if engine == "native" else LlamaCppTarget)(info, path, options)


def _model_path(name: str, store) -> Path:
    """A .gguf file path as it is, else the store model's GGUF layer."""
    candidate = Path(name).expanduser()
    if candidate.suffix == ".gguf" or candidate.is_file():
        if not candidate.is_file():
            raise TargetError(f"{name}: no such file")
        return candidate
    if store is None:
        raise TargetError(f"{name}: not a file, and no model store to look it up in")
    from registry.details import details_cache
    from registry.errors import RegistryError

    try:
        details = details_cache.get(store, store.resolve(name))
    except (RegistryError, FileNotFoundError):
        raise TargetError(f"{name}: no such model in the store (infer list shows the local models)") from None
    if details.model_path is None or details.gguf is None:
        raise TargetError(f"{name}: the model has no GGUF layer, which the in-process engines need")
    return details.model_path
