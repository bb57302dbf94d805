"""A small PyTorch inference engine in the vLLM / nano-vllm mould: paged KV cache, prefix caching,
continuous batching with chunked prefill, Triton kernels on GPU and their torch references on CPU.

The public names load on first use (PEP 562), so importing the package does not import torch.
It imports nothing from the rest of the project except `gguf_io` (GGUF reading, tokenizers), which
the gateway side reads models with too."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AsyncLLMEngine": ".async_engine",
    "CompletionOutput": ".output",
    "EngineConfig": ".config",
    "LLMEngine": ".llm_engine",
    "LoRARequest": ".lora.request",
    "RequestOutput": ".output",
    "SamplingParams": ".sampling_params",
    "StructuredOutputsParams": ".sampling_params",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .async_engine import AsyncLLMEngine
    from .config import EngineConfig
    from .llm_engine import LLMEngine
    from .lora.request import LoRARequest
    from .output import CompletionOutput, RequestOutput
    from .sampling_params import SamplingParams, StructuredOutputsParams


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
