"""Remote adapter types by name: ``create_remote(settings)`` builds the one ``settings.type`` names.

Each adapter module registers its class at import; ``REMOTE_TYPES`` lists the built-in ones in the
order the docs give them, and which of them speak the OpenAI API (their ``base_url`` may end in /v1).
"""

from __future__ import annotations

from importlib import import_module


from .base import RemoteBackend, RemoteSettings

REMOTE_TYPES = {"vllm": "adapters.remote.vllm", "tgi": "adapters.remote.tgi", "trtllm": "adapters.remote.trtllm",
                "triton": "adapters.remote.triton", "ollama": "adapters.remote.ollama",
                "llamacpp": "adapters.remote.llamacpp_server", "openai": "adapters.remote.openai_compat"}
OPENAI_TYPES = frozenset({"vllm", "trtllm", "llamacpp", "openai"})

_CLASSES: dict[str, type[RemoteBackend]] = {}


def register_remote(kind: str, cls: type[RemoteBackend]) -> None:
    _CLASSES[kind] = cls


def remote_class(kind: str) -> type[RemoteBackend]:
    if kind not in _CLASSES:
        if kind not in REMOTE_TYPES:
            raise ValueError(f"unknown backend type '{kind}' (choose one of {', '.join(REMOTE_TYPES)})")
        import_module(REMOTE_TYPES[kind])
    return _CLASSES[kind]


def create_remote(settings: RemoteSettings) -> RemoteBackend:
    return remote_class(settings.type)(settings)
