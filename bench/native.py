"""What the native engine costs on CPU: decode, batched throughput, TTFT and KV waste vs llama.cpp and transformers.

Builds one Qwen2-0.5B-shaped model with the project's builder (random weights, seed 0) twice, as an
f16 GGUF and as a bf16 Hugging Face directory (same weights), cached under .bench/native/. Then, in
one process and strictly one side at a time (each side loaded, warmed up once, measured, freed):

1. single-stream decode: a ~16-token prompt, 128 greedy tokens, ignore_eos; decode tok/s =
   (generated - 1) / (last token time - first token time); median over ``--runs``. Goal ours/llama.cpp >= 0.8.
2. mixed workload: 16 requests, prompts 32..256 tokens, outputs 64..128 tokens (lengths from a fixed
   seed), ignore_eos. Ours: all added at once, step loop. llama.cpp: one after another. transformers:
   ``generate`` on one left-padded static batch of 16 (bf16, max_new_tokens = the longest output;
   only the tokens each request asked for count). Output tok/s = requested output tokens / wall time.
   Goals: ours >= 8x llama.cpp, >= 1x transformers.
3. TTFT of a 512-token prompt (max_tokens=1); median over ``--runs``.
4. KV waste (allocated-but-unused slots / allocated slots of the running sequences), sampled after
   every step of the mixed workload; goal mean < 4 %.

Prompts are token ids drawn (seeded) from the builder's tokenizer run over its corpus; each prompt
starts with its own token, so no prefix cache (ours or llama.cpp's) is hit.

The machine may be shared: before each side the script waits (``--wait-idle`` s at most) for other
processes to go quiet, and the table reports how many cores others used while each side ran.

Then the same on a real model, SmolLM2-135M-Instruct (Q4_1) against llama-cpp-python on the same
file, with load time and accuracy: see bench/native_smollm2.py (``--model smollm2`` runs only that).

    .venv/bin/python bench/native.py [--model all|qwen2-0.5b|smollm2] [--quick] [--runs 3] [--threads N]
                                     [--wait-idle 120] [--json PATH] [--march x86-64-v3|x86-64]

``--march x86-64-v3`` measures the AVX2 tier (most laptops) side by side on a machine with more: our C kernels
built with that -march, PyTorch at ``ATEN_CPU_CAPABILITY=avx2``, and llama.cpp built for that level alone
(``GGML_NATIVE=OFF``, AVX2/FMA/F16C on, every AVX-512 flag off) from ``.bench/llama-cpp-x86-64-v3``, which
``scripts/install_llama_cpp.py --tier x86-64-v3`` builds (minutes, once).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch
from tokenizers import Tokenizer

from native_engine import LLMEngine, SamplingParams
from native_engine.kernels import cpu_kernels
from noise import cpu_ticks, others_cores, wait_idle  # noqa: E402  (bench/ is the script's directory)
import native_smollm2  # noqa: E402
from registry.modelbuilder import PRESETS, build_gguf, build_hf

WORK = ROOT / ".bench" / "native"
PRESET = "qwen2-0.5b"
CORPUS = ROOT / "registry" / "modelbuilder" / "data" / "corpus.txt"


@dataclass(slots=True)
class Workload:
    single_prompt: list[int]
    single_tokens: int
    ttft_prompts: list[list[int]]  # one per run
    mixed_prompts: list[list[int]]
    mixed_outputs: list[int]


@dataclass(slots=True)
class Result:
    decode_tps: float = float("nan")
    ttft_s: float = float("nan")
    mixed_tps: float = float("nan")
    mixed_wall_s: float = float("nan")
    extra: dict = field(default_factory=dict)


# -- models and prompts ---------------------------------------------------------------------


def build_models() -> tuple[Path, Path]:
    WORK.mkdir(parents=True, exist_ok=True)
    gguf, hf = WORK / f"{PRESET}-f16.gguf", WORK / f"{PRESET}-bf16"
    if not gguf.exists():
        print(f"building {gguf.name} (random weights, takes a while) ...", flush=True)
        build_gguf(gguf, PRESETS[PRESET], dtype="f16", seed=0)
    if not (hf / "config.json").exists():
        print(f"building {hf.name} ...", flush=True)
        build_hf(hf, PRESETS[PRESET], dtype="bf16", seed=0)
    return gguf, hf


def make_workload(hf: Path, quick: bool, runs: int) -> Workload:
    ids = Tokenizer.from_file(str(hf / "tokenizer.json")).encode(CORPUS.read_text()).ids
    rng = random.Random(0)
    starts = iter(rng.sample(sorted(set(ids)), 64))  # a distinct first token per prompt: no prefix reuse

    def prompt(n: int) -> list[int]:
        return [next(starts)] + [rng.choice(ids) for _ in range(n - 1)]

    n_mixed, (p_lo, p_hi), (o_lo, o_hi) = (4, (32, 64), (16, 32)) if quick else (16, (32, 256), (64, 128))
    lengths = random.Random(1234)
    mixed = [prompt(lengths.randint(p_lo, p_hi)) for _ in range(n_mixed)]
    outputs = [lengths.randint(o_lo, o_hi) for _ in range(n_mixed)]
    ttft_len = 128 if quick else 512
    return Workload(prompt(16), 32 if quick else 128, [prompt(ttft_len) for _ in range(runs)], mixed, outputs)


def decode_tps(times: list[float]) -> float:
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")


# -- ours -----------------------------------------------------------------------------------


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def ours_stream(engine: LLMEngine, prompt: list[int], max_tokens: int) -> tuple[float, list[float]]:
    """One request alone; returns (start time, time of each generated token)."""
    request_id = f"s{time.monotonic_ns()}"
    t0 = time.perf_counter()
    engine.add_request(request_id, prompt, params(max_tokens))
    times: list[float] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            times += [time.perf_counter()] * len(out.outputs[0].token_ids)
    return t0, times


def ours_mixed(engine: LLMEngine, w: Workload) -> tuple[float, list[float], int]:
    """All requests at once; returns (wall s, KV waste per step, generated tokens)."""
    blocks, sched = engine.scheduler.block_manager, engine.scheduler
    t0 = time.perf_counter()
    for i, (p, n) in enumerate(zip(w.mixed_prompts, w.mixed_outputs, strict=True)):
        engine.add_request(f"m{i}", p, params(n))
    waste, generated = [], 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            generated += len(out.outputs[0].token_ids)
        if sched.running:
            waste.append(blocks.kv_waste(sched.running))
    return time.perf_counter() - t0, waste, generated


def run_ours(gguf: Path, w: Workload, runs: int) -> Result:
    kv_bytes = 16 * 2048 * 2 * 24 * 2 * 64 * 2  # 16 seqs x 2048 tokens of bf16 K+V for this shape (384 MiB)
    t = time.perf_counter()
    engine = LLMEngine.from_model(str(gguf), dtype="auto", max_num_seqs=16, max_num_batched_tokens=512,
                                  kv_cache_memory_bytes=kv_bytes)
    print(f"ours: loaded in {time.perf_counter() - t:.1f} s (dtype {engine.dtype}, device {engine.device})", flush=True)
    engine.generate([w.mixed_prompts[0][:24], w.single_prompt], [params(8), params(4)])  # warm up (batch + single)
    r = Result()
    r.decode_tps = statistics.median(decode_tps(ours_stream(engine, [9 + i] + w.single_prompt[1:], w.single_tokens)[1])
                                     for i in range(runs))
    r.ttft_s = statistics.median(_first(*ours_stream(engine, p, 1)) for p in w.ttft_prompts)
    wall, waste, generated = ours_mixed(engine, w)
    assert generated == sum(w.mixed_outputs), (generated, sum(w.mixed_outputs))
    r.mixed_wall_s, r.mixed_tps = wall, generated / wall
    r.extra = {"kv_waste_mean": statistics.fmean(waste), "kv_waste_max": max(waste), "kv_waste_samples": len(waste),
               "stats": engine.stats(), "dtype": str(engine.dtype)}
    return r


def _first(t0: float, times: list[float]) -> float:
    return times[0] - t0


# -- llama.cpp ------------------------------------------------------------------------------


def llama_stream(llm, prompt: list[int], max_tokens: int) -> tuple[float, list[float]]:
    llm.reset()  # n_tokens = 0: eval() then drops the old KV cells, no prefix reuse
    t0 = time.perf_counter()
    times: list[float] = []
    for _ in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        times.append(time.perf_counter())
        if len(times) == max_tokens:
            break
    return t0, times


def run_llama(gguf: Path, w: Workload, runs: int, threads: int) -> Result:
    import llama_cpp

    llm = llama_cpp.Llama(str(gguf), n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    llama_stream(llm, w.mixed_prompts[0][:24], 8)  # warm up
    r = Result()
    r.decode_tps = statistics.median(decode_tps(llama_stream(llm, [9 + i] + w.single_prompt[1:], w.single_tokens)[1])
                                     for i in range(runs))
    r.ttft_s = statistics.median(_first(*llama_stream(llm, p, 1)) for p in w.ttft_prompts)
    t0, generated = time.perf_counter(), 0
    for p, n in zip(w.mixed_prompts, w.mixed_outputs, strict=True):
        generated += len(llama_stream(llm, p, n)[1])
    r.mixed_wall_s = time.perf_counter() - t0
    r.mixed_tps = generated / r.mixed_wall_s
    llm.close()
    return r


# -- transformers ---------------------------------------------------------------------------


def run_hf(hf: Path, w: Workload) -> Result:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None  # ignore_eos: every row runs max_new_tokens
    pad = 0
    hf_generate(model, [p[:16] for p in w.mixed_prompts[:2]], 4, pad)  # warm up
    t0 = time.perf_counter()
    out = hf_generate(model, w.mixed_prompts, max(w.mixed_outputs), pad)
    wall = time.perf_counter() - t0
    assert out.shape[1] == max(len(p) for p in w.mixed_prompts) + max(w.mixed_outputs), out.shape
    r = Result(mixed_wall_s=wall, mixed_tps=sum(w.mixed_outputs) / wall)
    r.extra = {"generated_incl_padding": len(w.mixed_prompts) * max(w.mixed_outputs)}
    return r


@torch.inference_mode()
def hf_generate(model, prompts: list[list[int]], max_new: int, pad: int) -> torch.Tensor:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                          do_sample=False, pad_token_id=pad)


# -- report ---------------------------------------------------------------------------------


def report(res: dict[str, Result], w: Workload, args, threads: int) -> None:
    ours, llama, hf = res["ours"], res["llama.cpp"], res["transformers"]
    n = len(w.mixed_prompts)
    print(f"\nmodel {PRESET} (random weights): ours {ours.extra['dtype']} from f16 GGUF, llama.cpp f16 GGUF, "
          f"transformers bf16; torch threads {threads}, llama.cpp threads {threads}, cpu_count {os.cpu_count()}"
          f"{', QUICK' if args.quick else ''}")
    print(f"single stream: prompt {len(w.single_prompt)} tok, {w.single_tokens} new; TTFT prompt "
          f"{len(w.ttft_prompts[0])} tok; medians of {args.runs} runs. mixed: {n} requests, prompts "
          f"{min(map(len, w.mixed_prompts))}..{max(map(len, w.mixed_prompts))} tok, outputs "
          f"{min(w.mixed_outputs)}..{max(w.mixed_outputs)} tok ({sum(w.mixed_outputs)} requested)\n")
    print(f"  {'':14s} {'decode tok/s':>13s} {'TTFT ms':>9s} {'mixed out tok/s':>16s} {'mixed wall s':>13s}"
          "  others' CPU (cores)")
    for name, r in res.items():
        print(f"  {name:14s} {r.decode_tps:13.1f} {r.ttft_s * 1e3:9.1f} {r.mixed_tps:16.1f} {r.mixed_wall_s:13.1f}"
              f"  {r.extra['others_cores']:19.2f}")
    print()
    _ratio("single-stream decode, ours / llama.cpp", ours.decode_tps / llama.decode_tps, ">= 0.8", 0.8)
    _ratio(f"mixed x{n} throughput, ours / llama.cpp (serial)", ours.mixed_tps / llama.mixed_tps, ">= 8", 8)
    _ratio(f"mixed x{n} throughput, ours / transformers (static)", ours.mixed_tps / hf.mixed_tps, ">= 1", 1)
    print(f"  TTFT {len(w.ttft_prompts[0])}-tok prompt, ours / llama.cpp: {ours.ttft_s / llama.ttft_s:.2f}x "
          "(lower is better)")
    e = ours.extra
    print(f"  KV waste under the mixed workload: mean {e['kv_waste_mean'] * 100:.2f} %, max "
          f"{e['kv_waste_max'] * 100:.2f} % over {e['kv_waste_samples']} steps (goal mean < 4 %)")
    print("  engine.stats(): " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in e["stats"].items()))
    print("  others' CPU = mean cores used by other processes while that side ran (loaded, warmed, measured); "
          "on a shared 2-core machine anything above ~0.2 slows both torch and llama.cpp a lot")


def _ratio(label: str, value: float, goal: str, bound: float) -> None:
    print(f"  {label}: {value:.2f}x (goal {goal}) {'ok' if value >= bound else 'BELOW GOAL'}")


def measure(name: str, fn, wait_s: float) -> Result:
    """Run one side (load, warm up, measure; freed afterwards) and note how busy the rest of the machine was."""
    idle = wait_idle(wait_s)
    t, a = time.perf_counter(), cpu_ticks()
    r = fn()
    r.extra["others_cores"] = others_cores(a, cpu_ticks(), time.perf_counter() - t)
    r.extra["others_cores_before"] = idle
    gc.collect()  # free this side's model before the next side loads
    print(f"{name}: done in {time.perf_counter() - t:.1f} s", flush=True)
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    parser.add_argument("--runs", type=int, default=3, help="repeats of the single-stream and TTFT measurements")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--wait-idle", type=float, default=120.0,
                        help="before each side, wait up to this many seconds for other processes to go quiet")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--model", choices=("all", PRESET, "smollm2"), default="all")
    parser.add_argument("--march", choices=sorted(TIER_CAPABILITY),
                        help="measure one CPU tier side by side: our C kernels built for it (INFER_CPU_MARCH), PyTorch "
                             "at its capability, and llama.cpp built for it (scripts/install_llama_cpp.py --tier)")
    args = parser.parse_args()
    if args.march:
        at_tier(args.march)
    torch.set_num_threads(args.threads)
    out: dict = {}
    if args.model in ("all", PRESET):
        out[PRESET] = run_random_model(args)
    if args.model in ("all", "smollm2"):
        idle = wait_idle(args.wait_idle)
        t, a = time.perf_counter(), cpu_ticks()
        out["smollm2"] = native_smollm2.run(args.runs, args.threads, args.quick)
        out["smollm2"]["others_cores"] = others_cores(a, cpu_ticks(), time.perf_counter() - t)
        native_smollm2.report(out["smollm2"])
        print(f"  others' CPU while it ran: {out['smollm2']['others_cores']:.2f} cores (before: {idle:.2f})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=str))


TIER_CAPABILITY = {"x86-64-v3": "avx2", "x86-64": "default"}  # PyTorch's kernels for each -march tier
# ... and the BLAS under PyTorch's float32 matmuls (prefill chunks), which picks its own instructions otherwise
TIER_BLAS = {"x86-64-v3": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
             "x86-64": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"}}


def at_tier(march: str) -> None:
    """Run this script again with every side at `march` (unless this process already is), then exit."""
    import llama_cpp

    folder = ROOT / ".bench" / f"llama-cpp-{march}"
    if os.environ.get("INFER_CPU_MARCH") == march:
        recorded = Path(llama_cpp.__file__).parent / ".infer-cmake-args"
        args = recorded.read_text() if recorded.exists() else "pip's default build, -march=native"
        print(f"tier {march}: our kernels -march={march} (tier {cpu_kernels.tier()}), PyTorch "
              f"{torch.backends.cpu.get_cpu_capability()}, llama.cpp from {Path(llama_cpp.__file__).parent} ({args})")
        return
    if not (folder / "llama_cpp").is_dir():
        sys.exit(f"no llama.cpp build for {march}: run `.venv/bin/python scripts/install_llama_cpp.py --tier {march}`")
    env = {**os.environ, "INFER_CPU_MARCH": march, "ATEN_CPU_CAPABILITY": TIER_CAPABILITY[march], **TIER_BLAS[march],
           "PYTHONPATH": os.pathsep.join(filter(None, (str(folder), os.environ.get("PYTHONPATH"))))}
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def run_random_model(args) -> dict:
    gguf, hf = build_models()
    w = make_workload(hf, args.quick, args.runs)
    res: dict[str, Result] = {}
    for name, fn in (("ours", lambda: run_ours(gguf, w, args.runs)),
                     ("llama.cpp", lambda: run_llama(gguf, w, args.runs, args.threads)),
                     ("transformers", lambda: run_hf(hf, w))):
        res[name] = measure(name, fn, args.wait_idle)
    report(res, w, args, torch.get_num_threads())
    return {k: {f: getattr(v, f) for f in Result.__slots__} for k, v in res.items()}


if __name__ == "__main__":
    main()
