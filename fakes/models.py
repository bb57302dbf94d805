"""The tiny test models, built with the project's own builder and installed into a store as `infer create` does:
the tests' session store and bench/hostile.py's."""

from __future__ import annotations

from pathlib import Path

from registry.create import create_model
from registry.modelbuilder import PRESETS, build_gguf
from registry.modelfile import parse_modelfile
from registry.names import parse_name
from registry.store import Store

from .ollama_templates import QWEN2 as QWEN2_GO_TEMPLATE  # Ollama's: exercises the Go-template path


def install_slow_model(root: Path, store: Store, name: str = "slow") -> None:
    """A wider model with a 4096-token context: thousands of tokens take seconds, so tests can
    act mid-stream (disconnect, cancel) without racing the end of generation."""
    spec = PRESETS["tiny-qwen2"].with_(name="slow", hidden_size=256, intermediate_size=768, num_layers=6,
                                       context_length=4096)
    gguf = build_gguf(root / "slow.gguf", spec, dtype="f32", seed=0)
    mf = parse_modelfile(f"FROM {gguf}\nPARAMETER num_ctx 4096\n")
    create_model(store, parse_name(name, insecure=True), mf, root)


def install_tiny_models(root: Path) -> Store:
    """A store under ``root`` with ``tiny`` (GGUF Jinja template), ``tiny-go`` (Go TEMPLATE + SYSTEM)
    and ``slow`` (see ``install_slow_model``).

    ``tiny`` and ``tiny-go`` are the tiny-qwen2 preset (context 512) with seed 0 and ``num_ctx 512``.
    """
    gguf = build_gguf(root / "tiny-qwen2.gguf", PRESETS["tiny-qwen2"], dtype="f32", seed=0)
    store = Store(root / "models")
    modelfiles = {
        "tiny": f"FROM {gguf}\nPARAMETER num_ctx 512\n",
        "tiny-go": (f'FROM {gguf}\nPARAMETER num_ctx 512\nPARAMETER stop "<|im_start|>"\n'
                    f'PARAMETER stop "<|im_end|>"\nTEMPLATE """{QWEN2_GO_TEMPLATE}"""\n'
                    'SYSTEM """You are a tiny test model."""\n'),
    }
    for name, text in modelfiles.items():
        create_model(store, parse_name(name, insecure=True), parse_modelfile(text), root)
    install_slow_model(root, store)
    return store
