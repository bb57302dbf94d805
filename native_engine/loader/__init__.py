"""Model loading: config, weights (GGUF or HF safetensors) and tokenizer, and the copy of the weights into a
built model (`weights.load_weights`, as vLLM's `default_weight_loader`). `model_loading.py`, beside this
package, is the engine's start-up sequence that calls it (checkpoint, model, KV cache, CUDA graphs).

The names load on first use (PEP 562). The GGUF header walker (`GGUFFile`) and the tokenizer come
from `gguf_io` and need no torch; `load_checkpoint` and the weight loaders (`checkpoint`,
`gguf_loader`, `hf_loader`, `weights`) do."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "GGUFFile": "gguf_io.gguf_file",
    "ModelConfig": ".model_config",
    "Q4Blocks": ".gguf_loader",
    "Tokenizer": "gguf_io.tokenizer",
    "load_checkpoint": ".checkpoint",
    "load_gguf": ".gguf_loader",
    "load_hf": ".hf_loader",
    "load_model": ".checkpoint",
    "load_tokenizer": "gguf_io.tokenizer",
    "tokenizer_from_gguf": "gguf_io.tokenizer",
}
__all__ = sorted(set(_EXPORTS) - {"GGUFFile"})

if TYPE_CHECKING:
    from .checkpoint import load_checkpoint, load_model
    from gguf_io.gguf_file import GGUFFile
    from .gguf_loader import Q4Blocks, load_gguf
    from .hf_loader import load_hf
    from .model_config import ModelConfig
    from gguf_io.tokenizer import Tokenizer, load_tokenizer, tokenizer_from_gguf


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
