"""llama.cpp's HTTP server: ``llama-server``, or llama-cpp-python's ``python -m llama_cpp.server``.

OpenAI-compatible, plus llama.cpp's sampling fields (``top_k``, ``min_p``, ``repeat_penalty``; ``ignore_eos``
as llama-server's ``ignore_eos`` and llama-cpp-python's ``min_tokens``) and its ``timings`` object (``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``), which gives the
server-measured prompt and generation times and, when no ``usage`` came, the token counts.
``health()`` asks ``/health`` (llama-server; llama-cpp-python has none, so ``/v1/models`` stands in)
and reads ``/slots`` and ``/metrics`` when the server exposes them (501 when disabled).
"""

from __future__ import annotations

from typing import Any, ClassVar

from core.base import Health, Usage
from .openai_compat import OpenAICompatBackend
from .base import Turn
from .registry import register_remote


METRICS = {"llamacpp:kv_cache_usage_ratio": "kv_cache_usage", "llamacpp:requests_processing": "requests_running",
           "llamacpp:requests_deferred": "requests_waiting"}


class LlamaCppServerBackend(OpenAICompatBackend):
    type: ClassVar[str] = "llamacpp-server"
    health_path: ClassVar[str] = "/health"
    EXTENSIONS: ClassVar[dict[str, str]] = {"top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repeat_penalty"}

    def sampling(self, options: dict[str, Any]) -> dict[str, Any]:
        """``ignore_eos`` as llama-server takes it, and as ``min_tokens = max_tokens`` for llama-cpp-python's
        server (which has no ``ignore_eos``; each ignores the other's field)."""
        out = super().sampling(options)
        if options.get("ignore_eos"):
            out["ignore_eos"] = True
            if "max_tokens" in out:
                out["min_tokens"] = out["max_tokens"]
        return out

    def read_event(self, event: dict[str, Any], turn: Turn, *, delta: bool) -> str:
        text = super().read_event(event, turn, delta=delta)
        timings = event.get("timings")
        if isinstance(timings, dict):
            read_timings(timings, turn)
        return text

    async def health(self) -> Health:
        health = await super().health()
        if health.detail == f"{self.health_path} answered 404":  # llama-cpp-python: no /health route
            return await self.probe("/v1/models")
        return health

    async def load_metrics(self) -> dict[str, float]:
        """Busy slots from ``/slots`` (llama-server; 501 when disabled, absent in llama-cpp-python), and
        the queue and KV-cache figures of ``/metrics`` (llama-server started with ``--metrics``)."""
        scraped = await self.prometheus_metrics(METRICS, ratios=frozenset({"kv_cache_usage"}))
        try:
            response = await self.client.get("/slots", self.headers())
            slots = response.json() if response.status_code == 200 else None
        except Exception:  # advisory only; 501/404 when the endpoint is off or absent
            return scraped
        if not isinstance(slots, list):
            return scraped
        busy = sum(1 for s in slots if isinstance(s, dict) and (s.get("is_processing") or s.get("state") == 1))
        return {"slots_total": float(len(slots)), "requests_running": float(busy), **scraped}


def read_timings(timings: dict[str, Any], turn: Turn) -> None:
    if "prompt_ms" in timings:
        turn.prompt_eval = float(timings["prompt_ms"]) / 1000
    if "predicted_ms" in timings:
        turn.eval = float(timings["predicted_ms"]) / 1000
    if turn.reported is None and "predicted_n" in timings:
        turn.reported = Usage(input_tokens=int(timings.get("prompt_n") or 0),
                              output_tokens=int(timings["predicted_n"]), source="backend")


register_remote("llamacpp", LlamaCppServerBackend)
