"""Fit MFU and MBU from an ``infer bench`` summary of the same backend and device.

The calibration point is the bench's lowest-concurrency load point (batch = its concurrency, 1 for
``synchronous``). With the benched model's shape and the mean prompt and output lengths it ran:
- MBU = ideal bandwidth-bound step time (MBU = 1) ÷ measured median TPOT, and
- MFU = ideal prefill time (MFU = 1) ÷ measured median TTFT,
then the roofline predicts other models and shapes with these two factors (Dynamo's planner corrects
its interpolations the same way, by measured ÷ expected). If the benched decode would be compute-bound
even at the fitted MBU, the TPOT fits MFU instead.
"""

from __future__ import annotations

from benchmark.report import load_summary

from .roofline import Deployment, Efficiency, decode_step, ttft_s


def calibration_point(summary: dict) -> dict:
    points = [p for p in summary["load_points"] if p.get("completed")]
    if not points:
        raise ValueError("the bench summary has no completed requests to calibrate from")
    return min(points, key=lambda p: (p.get("max_concurrency") or 10**9, p["request_throughput"]))


def fit(dep: Deployment, summary_path) -> tuple[Efficiency, dict]:
    point = calibration_point(load_summary(summary_path))
    prompt = max(1, round(point["total_input_tokens"] / point["completed"]))
    output = max(2, round(point["total_output_tokens"] / point["completed"]))
    batch = point.get("max_concurrency") or 1
    tpot, ttft = point["median_tpot_ms"] / 1000, point["median_ttft_ms"] / 1000
    if tpot <= 0 or ttft <= 0:
        raise ValueError("the calibration point has no TPOT/TTFT (outputs of one token?)")
    ideal = decode_step(dep, Efficiency(mfu=1.0, mbu=1.0), prompt, output, batch)
    mfu = ttft_s(dep, Efficiency(mfu=1.0, mbu=1.0), prompt) / ttft
    decode = ideal.tpot_s / tpot
    basis = {"load_point": point["load_point"], "batch": batch, "prompt_tokens": prompt, "output_tokens": output,
             "median_ttft_ms": point["median_ttft_ms"], "median_tpot_ms": point["median_tpot_ms"],
             "model": dep.model.name, "binds": ideal.binds}
    return Efficiency(mfu=mfu, mbu=decode, source="calibrated", decode_mfu=decode), basis
