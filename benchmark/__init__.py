"""``infer bench``: a load generator that measures any LLM server the way vLLM's benchmark does."""

from .clients import APIS, Endpoint
from .config import BenchConfig
from .metrics import calculate_metrics
from .records import BenchRequest, RequestRecord
from .session import BenchResult, run_bench

__all__ = ["APIS", "BenchConfig", "BenchRequest", "BenchResult", "Endpoint", "RequestRecord", "calculate_metrics",
           "run_bench"]
