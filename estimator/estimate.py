"""``infer estimate``: everything the roofline says about one deployment, as one JSON-ready dict.

Memory (parameters, weight bytes, KV bytes per token, KV capacity, max sequences), prefill FLOPs and
TTFT, decode FLOPs per token and TPOT with the binding limit, tok/s against batch, the largest batch
meeting a TPOT SLO, devices for a request rate (Little's law: in flight = rate × E2E), and $/Mtok split
the bill-conserving way (output weight k = prefill tok/s ÷ decode tok/s at that batch). With tensor
parallelism (``gpus`` > 1) the ``tensor_parallel`` section prices the all-reduces per layer and step and
compares the same workload on one device: whether TP pays.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from benchmark.cost import split_bill

from .flops import decode_flops_per_token, prefill_flops, rule_of_thumb
from .roofline import Deployment, Efficiency, decode_step, largest_batch_meeting, ttft_s
from .shape import parameter_count


@dataclass(frozen=True)
class Workload:
    input_tokens: int = 1024
    output_tokens: int = 1024
    batch: int = 1
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    rate: float | None = None
    price_per_hour: float | None = None

    def __post_init__(self) -> None:
        if min(self.input_tokens, self.output_tokens, self.batch) < 1:
            raise ValueError("--input-tokens, --output-tokens and --batch must be >= 1")


def estimate(dep: Deployment, work: Workload, eff: Efficiency) -> dict:
    m, p, o = dep.model, work.input_tokens, work.output_tokens
    step = decode_step(dep, eff, p, o, work.batch)
    prefill, decode = prefill_flops(m, p, work.batch), decode_flops_per_token(m, p, o, work.batch)
    thumb_prefill, thumb_decode = rule_of_thumb(m, p, work.batch)
    report = {
        "model": m.name, "device": dep.device.name, "gpus": dep.gpus, "dtype": dep.dtype or m.stored_dtype or "bf16",
        "efficiency": asdict(eff),
        "parameters": parameter_count(m), "weight_bytes": dep.weight_bytes,
        "kv_bytes_per_token": m.kv_bytes_per_token(dep.kv_dtype), "kv_capacity_tokens": dep.kv_capacity_tokens(),
        "max_concurrent_sequences": dep.max_sequences(p, o),
        "prefill_flops": prefill, "prefill_flops_rule_of_thumb": thumb_prefill,
        "ttft_ms": 1000 * ttft_s(dep, eff, p),
        "decode_flops_per_token": decode, "decode_flops_rule_of_thumb": thumb_decode,
        "flops_method_tok_s": dep.peak_flops * eff.mfu * work.batch / decode,
        "tpot_ms": 1000 * step.tpot_s, "tpot_memory_ms": 1000 * step.memory_s, "tpot_compute_ms": 1000 * step.compute_s,
        "binds": step.binds, "decode_tok_s_per_user": 1 / step.tpot_s, "decode_tok_s": step.tokens_per_s,
        "throughput_vs_batch": _batch_curve(dep, eff, p, o),
    }
    report.update(_slo_section(dep, eff, work, report["ttft_ms"]))
    if dep.gpus > 1:
        report["tensor_parallel"] = tensor_parallel_section(dep, eff, work)
    return report


def tensor_parallel_section(dep: Deployment, eff: Efficiency, work: Workload) -> dict:
    """The collectives' cost per layer and step, and the same workload on one device, at the workload's batch
    and at batch 1 and 64 (decode scaling)."""
    p, o = work.input_tokens, work.output_tokens
    one = dep.with_gpus(1)
    decode = dep.comm(work.batch, work.batch)
    step = decode_step(dep, eff, p, o, work.batch)
    scaling = {}
    for b in sorted({1, 64, work.batch}):
        mine, single = decode_step(dep, eff, p, o, b), decode_step(one, eff, p, o, b)
        scaling[str(b)] = {"tok_s": mine.tokens_per_s, "tok_s_one_device": single.tokens_per_s,
                           "speedup": mine.tokens_per_s / single.tokens_per_s, "comm_share": mine.comm_s / mine.tpot_s}
    ttft, ttft_one = ttft_s(dep, eff, p), ttft_s(one, eff, p)
    return {"ranks": dep.gpus, "link_gbs": dep.link.gbs, "link_latency_us": dep.link.latency_us,
            "all_reduces_per_layer": 2, "decode": decode.as_dict(), "prefill": dep.comm(p, 1).as_dict(),
            "comm_share_of_tpot": step.comm_s / step.tpot_s,
            "tpot_ms_one_device": 1000 * decode_step(one, eff, p, o, work.batch).tpot_s,
            "ttft_ms_one_device": 1000 * ttft_one, "ttft_speedup": ttft_one / ttft,
            "fits_one_device": one.kv_capacity_tokens() >= p + o, "decode_scaling": scaling,
            "pays": scaling[str(work.batch)]["speedup"] > 1}


def _batch_curve(dep: Deployment, eff: Efficiency, p: int, o: int) -> list[dict]:
    limit = max(1, dep.max_sequences(p, o))
    batches = sorted({min(2**k, limit) for k in range(0, 11)})
    curve = []
    for b in batches:
        s = decode_step(dep, eff, p, o, b)
        curve.append({"batch": b, "tpot_ms": 1000 * s.tpot_s, "tok_s": s.tokens_per_s, "binds": s.binds})
    return curve


def _slo_section(dep: Deployment, eff: Efficiency, work: Workload, ttft_ms: float) -> dict:
    p, o = work.input_tokens, work.output_tokens
    out: dict = {"ttft_meets_slo": None if work.ttft_slo_ms is None else ttft_ms <= work.ttft_slo_ms}
    batch = work.batch
    if work.tpot_slo_ms is not None:
        batch = largest_batch_meeting(dep, eff, p, o, work.tpot_slo_ms / 1000)
        out["largest_batch_meeting_tpot_slo"] = batch
    if batch < 1:
        return out
    step = decode_step(dep, eff, p, o, batch)
    e2e_s = ttft_ms / 1000 + (o - 1) * step.tpot_s
    per_deployment_rate = batch / e2e_s  # Little's law with `batch` requests in flight
    out["requests_per_s_per_deployment"] = per_deployment_rate
    if work.rate is not None:
        out["deployments_needed"] = math.ceil(work.rate / per_deployment_rate)
        out["devices_needed"] = out["deployments_needed"] * dep.gpus
    if work.price_per_hour is not None:
        k = (p / (ttft_ms / 1000)) / step.tokens_per_s
        c_in, c_out = split_bill(work.price_per_hour * dep.gpus, per_deployment_rate * p * 3600,
                                 per_deployment_rate * o * 3600, k)
        out.update({"output_input_weight": k, "input_usd_per_mtok": c_in * 1e6, "output_usd_per_mtok": c_out * 1e6})
    return out
