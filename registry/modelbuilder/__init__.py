"""Deterministic small LLMs for tests and benchmarks.

Random weights from a seed, a byte-level BPE tokenizer trained on a corpus
shipped with the package, and a ChatML chat template, written as GGUF (for
llama.cpp) or as a Hugging Face checkpoint directory (for transformers). The
GGUF and HF outputs of one spec and seed hold the same model.
"""

from __future__ import annotations

from .gguf_out import build_gguf
from .hf_out import build_hf
from .lora_out import LoraSpec, build_lora, spec_from_gguf
from .spec import PRESETS, ModelSpec
from .tokenizer import CHATML_TEMPLATE, SPECIAL_TOKENS, train_tokenizer

__all__ = [
    "CHATML_TEMPLATE",
    "PRESETS",
    "SPECIAL_TOKENS",
    "LoraSpec",
    "ModelSpec",
    "build_gguf",
    "build_hf",
    "build_lora",
    "spec_from_gguf",
    "train_tokenizer",
]
