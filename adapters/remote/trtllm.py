"""TensorRT-LLM's ``trtllm-serve`` (serving-protocols.md §3.1).

OpenAI-compatible, but its request models forbid unknown fields, so only fields it documents are
sent (``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos`` beyond OpenAI's). ``/metrics`` is
a JSON list of iteration stats, not Prometheus: ``health()`` reads the newest one for the number
of active and queued requests and the KV cache's used share of blocks.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .openai_compat import OpenAICompatBackend
from .registry import register_remote

METRICS_WAIT = 3.0  # the server holds /metrics up to ~2 s while it waits for fresh stats


class TrtLLMBackend(OpenAICompatBackend):
    type: ClassVar[str] = "trtllm"
    health_path: ClassVar[str] = "/health"
    EXTENSIONS: ClassVar[dict[str, str]] = {"top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repetition_penalty",
                                            "ignore_eos": "ignore_eos"}
    passes_fields = False  # trtllm-serve refuses fields it does not know

    async def load_metrics(self) -> dict[str, float]:
        try:
            response = await self.client.get("/metrics", self.headers(), timeout=METRICS_WAIT)
            stats = response.json() if response.status_code == 200 else []
        except Exception:  # advisory only
            return {}
        return iteration_load(stats[-1]) if isinstance(stats, list) and stats and isinstance(stats[-1], dict) else {}


def iteration_load(stats: dict[str, Any]) -> dict[str, float]:
    out = {key: float(stats[field]) for field, key in (("numActiveRequests", "requests_running"),
                                                       ("numQueuedRequests", "requests_waiting")) if field in stats}
    kv = stats.get("kvCacheStats") or {}
    if kv.get("maxNumBlocks"):
        out["kv_cache_usage"] = float(kv.get("usedNumBlocks", 0)) / float(kv["maxNumBlocks"])
    return out


register_remote("trtllm", TrtLLMBackend)
