"""Aggregate request records into vLLM's benchmark metrics (``vllm/benchmarks/serve.py:calculate_metrics``).

- output length: the server's count (usage chunk / ``eval_count``); the client re-tokenizes the text only
  when the server sent none (the record says ``usage_source="estimated"``).
- TPOT per request = ``(latency - ttft) / (output_len - 1)``, only for ``output_len > 1``;
  for goodput a request with ``output_len <= 1`` counts as TPOT 0.
- ITL is pooled: every request's gaps concatenated (weighted by chunks, unlike per-request TPOT).
- goodput = good requests / duration; a request is good iff every given SLO (ms) >= its metric.
  ``slo_attainment`` = good / all requests sent (errors count as misses).
- Statistics in ms: ``mean_*``, ``median_*``, ``std_*`` and ``p<P>_*`` (numpy linear percentiles).
- One intended difference: ``max_concurrent_requests`` is the peak of requests in flight at one instant;
  vLLM's counts every request active at some time in a 1-s bucket, so two requests one after the other
  in the same second count as 2 (``infer bench`` with ``synchronous`` says 1, vLLM's up to 2).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .records import RequestRecord

DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_KEYS = ("ttft", "tpot", "e2el")


def percentile_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def calculate_metrics(
    records: Sequence[RequestRecord],
    duration: float,
    *,
    goodput_slos: dict[str, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> dict:
    """vLLM's result dict for one load point (times in ms, throughputs per second of ``duration``)."""
    ok = [r for r in records if r.success]
    output_lens = [r.output_tokens or 0 for r in ok]
    tpots = [(r.latency - r.ttft) / (n - 1) for r, n in zip(ok, output_lens) if n > 1]
    samples = {
        "ttft": [r.ttft for r in ok],
        "tpot": tpots,
        "itl": [gap for r in ok for gap in r.itl],
        "e2el": [r.latency for r in ok],
    }
    total_input = sum(r.prompt_len for r in ok)
    total_output = sum(output_lens)
    result = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration,
        "output_throughput": total_output / duration,
        "total_token_throughput": (total_input + total_output) / duration,
        "max_output_tokens_per_s": peak_output_per_second(ok),
        "max_concurrent_requests": peak_concurrency(ok),
        "output_tokens_estimated": sum(1 for r in ok if r.usage_source == "estimated"),
    }
    for name in PERCENTILE_METRICS:
        result.update(_stats(name, samples[name], percentiles))
    median_tpot = result["median_tpot_ms"]
    result["median_tok_s_per_user"] = 1000.0 / median_tpot if median_tpot > 0 else 0.0
    if goodput_slos:
        good = count_good(ok, goodput_slos)
        result["request_goodput"] = good / duration
        result["good_completed"] = good
        result["slo_attainment"] = good / len(records) if records else 0.0
    else:
        result["request_goodput"] = None
    return result


def _stats(name: str, values: list[float], percentiles: Sequence[float]) -> dict:
    ms = np.asarray(values or [0.0], dtype=float) * 1000.0
    out = {f"mean_{name}_ms": float(np.mean(ms)), f"median_{name}_ms": float(np.median(ms)),
           f"std_{name}_ms": float(np.std(ms))}
    for p in percentiles:
        out[f"p{percentile_word(p)}_{name}_ms"] = float(np.percentile(ms, p))
    return out


def request_tpot(record: RequestRecord) -> float:
    """Seconds per output token after the first; 0 for one-token answers (vLLM's goodput rule)."""
    n = record.output_tokens or 0
    return (record.latency - record.ttft) / (n - 1) if n > 1 else 0.0


def is_good(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
    if not record.success:
        return False
    values = {"ttft": record.ttft, "tpot": request_tpot(record), "e2el": record.latency}
    return all(slo / 1000.0 >= values[key] for key, slo in slos_ms.items())


def count_good(records: Sequence[RequestRecord], slos_ms: dict[str, float]) -> int:
    return sum(1 for r in records if is_good(r, slos_ms))


def chunk_times(record: RequestRecord) -> list[float]:
    """Arrival times of the content chunks: ``start + ttft``, then each gap added."""
    times = [record.start_time + record.ttft]
    for gap in record.itl:
        times.append(times[-1] + gap)
    return times


def peak_output_per_second(records: Sequence[RequestRecord]) -> float:
    """Most content chunks landing in one 1-s bucket counted from the first request's start (vLLM)."""
    if not records:
        return 0.0
    origin = min(r.start_time for r in records)
    buckets: dict[int, int] = {}
    for r in records:
        for t in chunk_times(r):
            key = int(t - origin)
            buckets[key] = buckets.get(key, 0) + 1
    return float(max(buckets.values()))


def peak_concurrency(records: Sequence[RequestRecord]) -> int:
    """Sweep-line peak of requests in flight (an end at the same instant as a start closes first)."""
    events = sorted([(r.start_time, 1) for r in records] + [(r.end_time, -1) for r in records],
                    key=lambda e: (e[0], e[1]))
    peak = running = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak
