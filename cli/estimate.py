"""``infer estimate``: predict a deployment from the model's shape and a device's specs (roofline)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate_cmd)


def _store_gguf(name: str) -> Path | None:
    from .bench import _store_tokenizer

    return _store_tokenizer(name)


def estimate_cmd(
    model: str = typer.Argument(..., help="Store model, .gguf file, or Hugging Face config.json (or its directory)."),
    device: str = typer.Option("h100", "--device", help="h100|h200|a100-80g|a100-40g|l40s|l4|rtx4090|mi300x|cpu."),
    gpus: int = typer.Option(1, "--tp", "--gpus", min=1, help="Devices per deployment, the model split over them "
                             "(tensor parallelism: the all-reduces per layer are priced, and one device compared)."),
    link_gbs: float = typer.Option(None, "--link-gbs", help="Override the device-to-device link, GB/s per direction "
                                   "(NVLink, PCIe; the device's own by default)."),
    link_latency_us: float = typer.Option(None, "--link-latency-us", help="Override the link's latency per ring hop "
                                          "(µs; bench/tp.py measures this machine's gloo all-reduce)."),
    dtype: str = typer.Option(None, "--dtype", help="bf16|fp8|int8|int4 weights (default: the GGUF's own, else bf16)."),
    kv_dtype: str = typer.Option("bf16", "--kv-dtype", help="KV cache dtype: bf16|fp8|int8|int4|f32."),
    input_tokens: int = typer.Option(1024, "--input-tokens", min=1, help="Prompt tokens."),
    output_tokens: int = typer.Option(1024, "--output-tokens", min=1, help="Output tokens."),
    batch: int = typer.Option(1, "--batch", min=1, help="Concurrent sequences."),
    slo: str = typer.Option(None, "--slo", help="ttft:500,tpot:50 (ms)."),
    rate: float = typer.Option(None, "--rate", help="Requests per second to size for."),
    price_per_hour: float = typer.Option(None, "--price-per-hour", help="$ per device-hour: adds $/Mtok in and out."),
    calibrate: Path = typer.Option(None, "--calibrate", help="infer bench summary.json (or its DIR) to fit MFU/MBU."),
    calibrate_model: str = typer.Option(None, "--calibrate-model", help="The benched model (default: the summary's model)."),
    peak_tflops: float = typer.Option(None, "--peak-tflops", help="Override the device's peak TFLOP/s."),
    bandwidth_gbs: float = typer.Option(None, "--bandwidth-gbs", help="Override the device's memory bandwidth."),
    memory_gb: float = typer.Option(None, "--memory-gb", help="Override the device's memory."),
    reprobe: bool = typer.Option(False, "--reprobe", help="--device cpu: measure this machine again (else cached)."),
    mfu: float = typer.Option(None, "--mfu", help="Fraction of peak FLOP/s achieved (default 0.6, or calibrated)."),
    mbu: float = typer.Option(None, "--mbu", help="Fraction of peak bandwidth achieved (default 0.7, or calibrated)."),
    as_json: bool = typer.Option(False, "--json", help="Print the estimate as JSON."),
) -> None:
    """Parameters, memory, KV capacity, TTFT, TPOT (and which limit binds), batch curve, SLO sizing, $/Mtok."""
    from estimator import Deployment, Efficiency, Workload, estimate, fit, get_device, load_shape
    from estimator.shape import BYTES_PER_PARAM

    try:
        if dtype is not None and dtype not in BYTES_PER_PARAM or kv_dtype not in BYTES_PER_PARAM:
            raise ValueError(f"--dtype/--kv-dtype must be one of {', '.join(BYTES_PER_PARAM)}")
        if reprobe and device == "cpu":
            from estimator.devices import cpu_device

            cpu_device(refresh=True)
        dev = get_device(device, peak_tflops=peak_tflops, bandwidth_gbs=bandwidth_gbs, memory_gb=memory_gb,
                         link_gbs=link_gbs, link_latency_us=link_latency_us)
        slos = _parse_slo(slo)
        work = Workload(input_tokens, output_tokens, batch, slos.get("ttft"), slos.get("tpot"), rate, price_per_hour)
        target = Deployment(load_shape(model, _store_gguf), dev, gpus, dtype, kv_dtype)
        eff, basis = Efficiency(), None
        if calibrate:
            bench_model = calibrate_model or _summary_model(calibrate)
            eff, basis = fit(Deployment(load_shape(bench_model, _store_gguf), dev, gpus, dtype, kv_dtype), calibrate)
        if mfu is not None or mbu is not None:
            eff = Efficiency(mfu=mfu or eff.mfu, mbu=mbu or eff.mbu, source="given")
        report = estimate(target, work, eff) | {"calibration": basis}
    except ValueError as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from None
    for warning in (basis or {}).get("warnings", []):
        typer.echo(f"warning: {warning}", err=True)
    typer.echo(json.dumps(report, indent=2) if as_json else _text(report))


def _parse_slo(text: str | None) -> dict[str, float]:
    from benchmark.config import parse_goodput

    slos = parse_goodput([text]) if text else {}
    if "e2el" in slos:
        raise ValueError("--slo takes ttft and tpot")
    return slos


def _summary_model(path: Path) -> str:
    from benchmark.report import load_summary

    summary = load_summary(path)
    return summary.get("label", {}).get("model_path") or summary["model_id"]


def _tp_text(t: dict) -> list[str]:
    d, p = t["decode"], t["prefill"]
    lines = [
        f"tensor parallel       {t['ranks']} ranks, link {t['link_gbs']:g} GB/s, {t['link_latency_us']:g} us/hop; "
        f"{t['all_reduces_per_layer']} all-reduces per layer",
        f"  decode all-reduce   {d['bytes_per_all_reduce'] / 1024:.1f} KiB, {d['all_reduce_us']:.1f} us; "
        f"{d['per_layer_us']:.1f} us/layer, {d['total_ms']:.3f} ms/step ({100 * t['comm_share_of_tpot']:.0f}% of TPOT)",
        f"  prefill all-reduce  {p['bytes_per_all_reduce'] / 1024:.1f} KiB, {p['all_reduce_us']:.1f} us; "
        f"{p['total_ms']:.3f} ms per prompt (TTFT speedup {t['ttft_speedup']:.2f}x)",
    ]
    for b, s in t["decode_scaling"].items():
        lines.append(f"  batch {b:>4}: {s['tok_s']:.1f} tok/s vs {s['tok_s_one_device']:.1f} on one device "
                     f"({s['speedup']:.2f}x, comm {100 * s['comm_share']:.0f}% of the step)")
    verdict = "pays" if t["pays"] else "does not pay"
    fits = "" if t["fits_one_device"] else " (the model does not fit one device: TP is needed anyway)"
    return lines + [f"  TP {verdict} at this batch{fits}"]


def _text(r: dict) -> str:
    g = 1e9
    eff = r["efficiency"]
    lines = [
        f"model {r['model']} on {r['gpus']} x {r['device']} ({r['dtype']} weights); "
        f"MFU {eff['mfu']:.2f}, MBU {eff['mbu']:.2f} ({eff['source']})",
        f"parameters            {r['parameters'] / g:.3f} B    weights {r['weight_bytes'] / g:.2f} GB",
        f"KV per token          {r['kv_bytes_per_token'] / 1024:.1f} KiB   capacity {r['kv_capacity_tokens']:,} tokens, "
        f"{r['max_concurrent_sequences']:,} sequences",
        f"prefill               {r['prefill_flops'] / 1e12:.3f} TFLOP  -> TTFT {r['ttft_ms']:.1f} ms",
        f"decode                {r['decode_flops_per_token'] / g:.3f} GFLOP/token -> TPOT {r['tpot_ms']:.2f} ms "
        f"(bandwidth {r['tpot_memory_ms']:.2f} ms, compute {r['tpot_compute_ms']:.2f} ms: {r['binds']} binds)",
        f"decode speed          {r['decode_tok_s_per_user']:.1f} tok/s per user, {r['decode_tok_s']:.1f} tok/s total",
        "batch  TPOT ms   tok/s   binds",
    ]
    lines += [f"{c['batch']:>5}  {c['tpot_ms']:>7.2f}  {c['tok_s']:>7.1f}   {c['binds']}" for c in r["throughput_vs_batch"]]
    for key, title in (("largest_batch_meeting_tpot_slo", "largest batch meeting the TPOT SLO"),
                       ("ttft_meets_slo", "TTFT meets the SLO"),
                       ("requests_per_s_per_deployment", "requests/s per deployment"),
                       ("devices_needed", "devices needed for the rate"),
                       ("input_usd_per_mtok", "input $/Mtok"), ("output_usd_per_mtok", "output $/Mtok")):
        if r.get(key) is not None:
            value = r[key]
            lines.append(f"{title}: {value:.4f}" if isinstance(value, float) else f"{title}: {value}")
    if r.get("tensor_parallel"):
        lines += _tp_text(r["tensor_parallel"])
    if r.get("calibration"):
        c = r["calibration"]
        lines.append(f"calibrated on {c['model']} at {c['load_point']} (TTFT {c['median_ttft_ms']:.1f} ms, "
                     f"TPOT {c['median_tpot_ms']:.2f} ms, {c['prompt_tokens']} in / {c['output_tokens']} out)")
    return "\n".join(lines)
