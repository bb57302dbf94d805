"""Fit MFU and MBU from an ``infer bench`` summary of the same backend and device.

The calibration point is the bench's lowest-concurrency load point (batch = its concurrency, 1 for
``synchronous``). With the benched model's shape and the mean prompt and output lengths it ran:
- MBU = ideal bandwidth-bound step time (MBU = 1) ÷ measured median TPOT, and
- MFU = ideal prefill time (MFU = 1) ÷ measured median TTFT,
then the roofline predicts other models and shapes with these two factors (Dynamo's planner corrects
its interpolations the same way, by measured ÷ expected). If the benched decode would be compute-bound
even at the fitted MBU, the TPOT fits MFU instead. A factor over 1 cannot be (the device would beat its
own peak): the calibration says so in its ``warnings``, and ``infer estimate`` prints them.
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
             "model": dep.model.name, "binds": ideal.binds, "warnings": impossible(mfu, decode)}
    return Efficiency(mfu=mfu, mbu=decode, source="calibrated", decode_mfu=decode), basis


def impossible(mfu: float, mbu: float) -> list[str]:
    """What a fit above 100 % of the device's peak means: the peaks are wrong, or the bench's timings are."""
    out = []
    for name, value, peak in (("MFU", mfu, "peak FLOP/s"), ("MBU", mbu, "peak bandwidth")):
        if value > 1.0:
            out.append(f"calibrated {name} {value:.2f} is over 100 %: the device's {peak} is underestimated "
                       f"(probe it again with --reprobe on an idle machine, or give --peak-tflops/--bandwidth-gbs) "
                       f"or the bench ran on a machine whose load changed; predictions from it are not trustworthy")
    return out
