"""A small PyTorch inference engine in the vLLM / nano-vllm mould: paged KV cache, prefix caching,
continuous batching with chunked prefill, Triton kernels on GPU and their torch references on CPU."""

from .async_engine import AsyncLLMEngine
from .config import EngineConfig
from .llm_engine import LLMEngine
from .output import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams

__all__ = ["AsyncLLMEngine", "CompletionOutput", "EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
