"""vLLM's OpenAI-compatible server (serving-protocols.md §1).

Generation is the OpenAI adapter's, plus vLLM's sampling extensions (``top_k``, ``min_p``,
``repetition_penalty``, ``ignore_eos``). ``health()`` adds the scheduler's load from ``/metrics``:
``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc``
(``vllm:gpu_cache_usage_perc`` on servers older than 0.9), and the KV cache's size in tokens
(``vllm:cache_config_info``: ``num_gpu_blocks`` × ``block_size``), for the router to use.
"""

from __future__ import annotations

from typing import ClassVar

from .openai_compat import OpenAICompatBackend
from .registry import register_remote

METRICS = {"vllm:num_requests_running": "requests_running", "vllm:num_requests_waiting": "requests_waiting",
           "vllm:kv_cache_usage_perc": "kv_cache_usage", "vllm:gpu_cache_usage_perc": "kv_cache_usage",
           "vllm:cache_config_info": "kv_cache_tokens"}


class VLLMBackend(OpenAICompatBackend):
    type: ClassVar[str] = "vllm"
    health_path: ClassVar[str] = "/health"
    EXTENSIONS: ClassVar[dict[str, str]] = {"top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repetition_penalty",
                                            "ignore_eos": "ignore_eos"}
    continuous_usage = True

    def think_fields(self, think: bool | str) -> dict:
        """vLLM hands ``enable_thinking`` to the chat template (Qwen3, DeepSeek-R1 distills)."""
        return {"chat_template_kwargs": {"enable_thinking": think is not False},
                **({"reasoning_effort": think} if isinstance(think, str) else {})}

    async def load_metrics(self) -> dict[str, float]:
        return await self.prometheus_metrics(METRICS, {"model_name": self.settings.model},
                                             ratios=frozenset({"kv_cache_usage"}))


register_remote("vllm", VLLMBackend)
