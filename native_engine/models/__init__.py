from __future__ import annotations

from torch import nn

from .llama import LlamaForCausalLM
from .qwen2 import Qwen2ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
}


def model_class(architecture: str) -> type[nn.Module]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        known = ", ".join(sorted(MODEL_REGISTRY))
        raise ValueError(f"the native engine does not support architecture {architecture!r} (supported: {known})") from None
