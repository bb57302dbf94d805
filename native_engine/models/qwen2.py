"""Qwen2: the Llama decoder with q/k/v biases (taken from the config's `qkv_bias`)."""

from __future__ import annotations

from .llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    pass
