"""Where the native engine's decode step spends its time, for bench/native_gpu.py (device-agnostic: on CPU the
same code profiles CPU ops, so the quick run of the default suite keeps it working).

- `decode_profile`: `batch` requests decoding; the wall time per step (no profiler, median of a few windows)
  with scheduling ahead off and on, then torch.profiler over `steps` steps: the device's busy time per step
  (the union of its kernels' and copies' intervals), the idle gap (wall - busy), kernels per step and the top
  kernels by time.
- `mixed_profile`: one step of decoding rows beside fresh prompts' prefill chunks, with the per-chunk attention
  path and with the unified attention kernel: wall time, the device's busy time, kernels, the top kernels.
- `gemv_table`: each distinct linear shape of the model at one row, the matmul the decode step runs
  (`torch.nn.functional.linear`, cuBLAS), in microseconds and as a share of the measured copy bandwidth, beside
  the best of a few configurations of a Triton split-K GEMV (`native_engine/kernels/gemv.py`, not on the
  engine's path); the weights rotate through copies larger than the L2 cache so each call reads from memory.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _start(engine, batch: int, params, tag: str) -> list[str]:
    ids = [f"{tag}-{i}" for i in range(batch)]
    for i, request_id in enumerate(ids):
        engine.add_request(request_id, [100 + (i * 7 + len(tag)) % 800] + list(range(300, 315)), params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running + engine.scheduler.waiting):
        engine.step()
    return ids


def _stop(engine, ids: list[str]) -> None:
    for request_id in ids:
        engine.abort(request_id)
    while engine.has_unfinished_requests():  # the step scheduled ahead, if any
        engine.step()


def _wall_us(engine, steps: int, windows: int = 3) -> float:
    """Median over `windows` runs of `steps` steps of the wall time per step."""
    times = []
    for _ in range(windows):
        _sync(engine.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        _sync(engine.device)
        times.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(times)


def _intervals(prof, device: torch.device) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of the device's work (kernels, copies, memsets); on CPU the top-level ops."""
    out = []
    for e in prof.events():
        if device.type == "cuda" and e.device_type != DeviceType.CUDA:
            continue
        if device.type != "cuda" and (e.device_type != DeviceType.CPU or e.cpu_parent is not None):
            continue
        out.append((e.name, e.time_range.start, e.time_range.end))
    return out


def _union_us(spans: list[tuple[str, float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for _, s, e in sorted(spans, key=lambda x: x[1]):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def _top(spans: list[tuple[str, float, float]], steps: int, n: int = 8) -> list[dict]:
    by: dict[str, list[float]] = {}
    for name, s, e in spans:
        by.setdefault(name, []).append(e - s)
    rows = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:n]
    return [{"name": name[:90], "calls_per_step": len(d) / steps, "us_per_step": sum(d) / steps} for name, d in rows]


def _profiled(device: torch.device, run, steps: int, top: int = 8) -> dict:
    """`run()` (`steps` engine steps) under torch.profiler: the device's busy time and kernels per step, and the
    top kernels."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    with profile(activities=activities) as prof:
        run()
        _sync(device)
    spans = _intervals(prof, device)
    return {"busy_us": _union_us(spans) / steps, "kernels_per_step": len(spans) / steps,
            "top": _top(spans, steps, top)}


def decode_profile(engine, batch: int, params, steps: int = 20) -> dict:
    """Steady decode steps of `batch` requests: wall per step with and without scheduling ahead, then a profile."""
    device = engine.device
    ids = _start(engine, batch, params, f"prof{batch}")
    res: dict = {"batch": batch}
    try:
        flag = engine.async_scheduling
        for name, value in (("sync", False), ("ahead", True)):
            engine.async_scheduling = value
            engine.step()  # settle into the mode
            res[f"wall_us_{name}"] = _wall_us(engine, steps)
        engine.async_scheduling = flag
        engine.step()
        res["wall_us"] = _wall_us(engine, steps, windows=1)
        res.update(_profiled(device, lambda: [engine.step() for _ in range(steps)], steps))
        res["gap_us"] = res["wall_us"] - res["busy_us"]
    finally:
        _stop(engine, ids)
    return res


def mixed_profile(engine, decodes: int, chunk_len: int, params, repeats: int = 3) -> dict:
    """One mixed step (`decodes` requests decoding beside as many fresh `chunk_len`-token prompts as the token
    budget holds, one prefill chunk each) with the per-chunk attention path and with the unified kernel: the
    median wall time of `repeats` such steps after a warm-up, then one under torch.profiler (device busy time,
    kernels, top kernels). Each step's prompts are new (no prefix hits) and stop after their first token, so
    the decoding batch stays the same. Scheduling ahead is off meanwhile: every step here is a mixed one."""
    device, inputs = engine.device, engine.model_runner.inputs
    budget = engine.config.max_num_batched_tokens
    chunks = max(1, min(16, (budget - decodes) // chunk_len))
    ids = _start(engine, decodes, params, f"mix{decodes}")
    ahead, unified, fresh = engine.async_scheduling, inputs.unified, iter(range(10_000))
    res: dict = {"decodes": decodes, "chunks": chunks, "chunk_len": chunk_len}

    def step() -> None:
        for _ in range(chunks):
            n = next(fresh)
            prompt = [100 + n % 800, 100 + n // 800] + list(range(300, 298 + chunk_len))
            engine.add_request(f"mixc-{n}", prompt, dataclasses.replace(params, max_tokens=1))
        engine.step()

    try:
        engine.async_scheduling = False
        engine.step()  # collect what was launched ahead
        for name, on in (("per_chunk", False), ("unified", True)):
            inputs.unified = on
            step()  # warm-up: this shape's kernels
            walls = []
            for _ in range(repeats):
                _sync(device)
                t0 = time.perf_counter()
                step()
                _sync(device)
                walls.append((time.perf_counter() - t0) * 1e6)
            res[name] = {"wall_us": statistics.median(walls), **_profiled(device, step, 1, top=6)}
    finally:
        engine.async_scheduling, inputs.unified = ahead, unified
        _stop(engine, ids)
    return res


def linear_shapes(model) -> list[tuple[str, int, int]]:
    """(name, out_features, in_features) of each distinct dense weight the decode step multiplies by."""
    seen: dict[tuple[int, int], str] = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if weight is None or weight.dim() != 2 or not name.split(".")[-1].endswith(("proj", "head")):
            continue
        seen.setdefault(tuple(weight.shape), name.split(".")[-1])
    return [(n, o, i) for (o, i), n in seen.items()]


def _time_s(fn, weights: list, reps: int, device: torch.device) -> float:
    for w in weights:
        fn(w)
    _sync(device)
    if device.type != "cuda":
        t0 = time.perf_counter()
        for r in range(reps):
            fn(weights[r % len(weights)])
        return (time.perf_counter() - t0) / reps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for r in range(reps):
        fn(weights[r % len(weights)])
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def gemv_configs(out_f: int, sms: int) -> list[tuple[int, int, int]]:
    """(block_n, block_k, split_k): whole rows when there are enough of them to fill the device, else K split
    so that about two programs per SM run."""
    configs = [(32, 256, 1), (16, 512, 1)]
    split = max(1, min(8, -(-2 * sms // -(-out_f // 32))))
    if split > 1:
        configs += [(32, 256, split), (16, 256, min(8, 2 * split))]
    return configs


def gemv_table(model, bandwidth: float, device: torch.device, dtype: torch.dtype, reps: int = 30) -> list[dict]:
    """One-row matmuls at the model's shapes: cuBLAS (F.linear) and the Triton GEMV, microseconds and bytes per
    second over the copy bandwidth."""
    from native_engine.kernels.gemv import gemv_triton

    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    rows, triton_ok = [], device.type == "cuda"
    for name, out_f, in_f in linear_shapes(model):
        nbytes = out_f * in_f * torch.empty((), dtype=dtype).element_size()
        copies = max(2, min(16, -(-(256 << 20) // nbytes)))  # > L2: each call reads its weight from memory
        weights = [torch.randn(out_f, in_f, device=device, dtype=dtype) for _ in range(copies)]
        x = torch.randn(1, in_f, device=device, dtype=dtype)
        seconds = _time_s(lambda w: torch.nn.functional.linear(x, w), weights, reps, device)
        row = {"name": name, "shape": [out_f, in_f], "us": seconds * 1e6, "of_bandwidth": nbytes / seconds / bandwidth}
        if triton_ok:
            try:
                best = min((_time_s(lambda w, c=c: gemv_triton(x, w, *c), weights, reps, device), c)
                           for c in gemv_configs(out_f, sms))
                row["triton_us"], row["triton_config"] = best[0] * 1e6, list(best[1])
                row["triton_of_bandwidth"] = nbytes / best[0] / bandwidth
                err = (gemv_triton(x, weights[0], *best[1]).float() - torch.nn.functional.linear(x, weights[0]).float())
                row["triton_max_err"] = float(err.abs().max())
            except Exception as exc:  # reported, and the table goes on without it
                row["triton_error"], triton_ok = f"{type(exc).__name__}: {exc}"[:300], False
        rows.append(row)
        del weights
    return rows


def _print_top(top: list[dict], indent: int) -> None:
    for t in top:
        print(f"{'':{indent}s}{t['us_per_step']:8.1f} us {t['calls_per_step']:6.1f}x  {t['name']}")


def report_profile(shape: str, prof: dict) -> None:
    for key in sorted(k for k in prof if k.startswith("decode_")):
        p = prof[key]
        if "error" in p:
            print(f"{shape:6s} {key}: failed: {p['error']}")
            continue
        print(f"{shape:6s} {key}: wall {p['wall_us']:.0f} us/step (ahead off {p['wall_us_sync']:.0f}, on "
              f"{p['wall_us_ahead']:.0f}); device busy {p['busy_us']:.0f} us, idle {p['gap_us']:.0f} us; "
              f"{p['kernels_per_step']:.0f} kernels/step")
        _print_top(p["top"], 8)
    mixed = prof.get("mixed")
    if mixed is not None and "error" in mixed:
        print(f"{shape:6s} mixed step: failed: {mixed['error']}")
    elif mixed is not None:
        print(f"{shape:6s} mixed step ({mixed['decodes']} decodes + {mixed['chunks']} fresh prompts of "
              f"{mixed['chunk_len']}):")
        for name in ("per_chunk", "unified"):
            p = mixed[name]
            print(f"{'':8s}{name:9s} wall {p['wall_us']:8.0f} us; device busy {p['busy_us']:8.0f} us; "
                  f"{p['kernels_per_step']:.0f} kernels")
            _print_top(p["top"], 10)
    for row in prof.get("gemv", []):
        triton = f"; triton {row['triton_us']:7.1f} us {row['triton_of_bandwidth']:6.1%} {row['triton_config']}" \
            if "triton_us" in row else (f"; triton failed: {row['triton_error']}" if "triton_error" in row else "")
        print(f"{shape:6s} gemv {row['name']:12s} {row['shape'][0]:>6d}x{row['shape'][1]:<6d} cuBLAS {row['us']:7.1f} us "
              f"{row['of_bandwidth']:6.1%} of copy bandwidth{triton}")
