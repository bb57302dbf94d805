"""Can one core prefill what issue 43's load sends it? Required vs achieved vs ceiling, and the P99 ITL arithmetic.

1P+1D puts every long prompt on ONE prefill core: the issue's load (``--long-prompt`` 2,000 tokens every
``--every`` 2 s) asks it for prompt tokens at ``long_prompt / every`` per second (1,000 tok/s). This
prints, on one core (this process pinned to ``--core``, one torch thread):

- **required**: that rate, in tok/s and GFLOP/s; FLOPs a token = 2 x the non-embedding weights (q, k, v,
  o, gate, up, down of every layer) + the causal attention (QK^T and AV: 4 x heads x head_dim x the
  position, averaged over the prompt); the LM head runs for the last token only (as vLLM's does);
- **achieved**: the native engine's prefill of a ``--long-prompt`` prompt (one request, ``max_tokens``
  1, the engine as ``infer serve`` builds it: f32 with the int16 tiled Q4_1 kernels, 2,048-token steps),
  the same engine with ``cpu_bf16_prefill`` (bf16 weight copies through oneDNN, AMX here, and bf16
  flash attention: ``native_engine/layers/bf16_prefill.py``; left out where the CPU cannot prove it), and llama.cpp's (llama-cpp-python in .venv, one thread, the same GGUF, ``n_batch`` 512, flash
  attention), the best of ``--runs`` prompts (min: the machine is shared), tok/s and GFLOP/s;
- **ceiling**: the peak of the instructions under them on registers only (``bench/isa_peak.c``'s
  ``vpdpwssd`` zmm, the tiled kernel's; ``bench/prefill_peak.c``'s 8-bit ``vpdpbusd`` and the AMX tile
  multiplies ``tdpbssd`` / ``tdpbf16ps``), and what PyTorch's own GEMM (oneDNN) reaches on the model's
  gate_up shape at the prompt's rows, in f32 and in bf16 (AMX);
- the utilisation of the prefill core at the required rate (> 1: the prefill queue grows without bound).

Then the decode side: the engine's decode step at batch 4 (each of two co-located runners) and 8 (1P+1D's
one decode runner), CPU ms a step, median of ``--steps``; and at this load the share of co-located ITLs
that a prefill stalls (``stalled_share``): P99
ITL sees the stalls only when that share is over 1 %; below it co-located P99 is the plain batch-4 step
and 1P+1D's is the batch-8 step, so 1P+1D cannot win P99. (A prompt's prefill is one engine step: it fits
the engine's 2,048-token budget; the streams on that runner get one long gap each.) Last, the SLO goodput
each side would reach with nothing but its engine steps (``goodput_ideal``: every long prompt finished,
the streams of ``bench/disagg.py`` decoding at those step costs, on two runners for the time they do not
prefill or on 1P+1D's decode core all the time): the most 1P+1D can gain over co-located at this load.

    flock /tmp/infer-heavy.lock .venv/bin/python bench/disagg_limits.py [--long-prompt 2000] [--every 2] [--runs 3]
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from cpu_tiers import peak  # noqa: E402  (bench/ is the script's directory)
from disagg import STREAM_TOKENS, STREAMS  # noqa: E402  (the load bench/disagg.py sends)
from native_engine import LLMEngine, SamplingParams  # noqa: E402
from registry.realmodels import fetch_smollm2  # noqa: E402

CONTEXT = 4096
F32, BF16 = "native engine (f32, int16 tiles)", "native engine (bf16 prefill, AMX)"


def flops_per_token(cfg, prompt: int) -> float:
    """Mean FLOPs a prompt token costs: the layers' matmuls + the causal attention (mean position)."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    weights = cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size
    attention = 4 * q * (prompt + 1) / 2
    return cfg.num_layers * (2 * weights + attention)


def prompts(n: int, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)  # a distinct first token each: no prefix-cache hit
    return [[rng.randrange(100, 40000) for _ in range(n)] for _ in range(count)]


def native_prefill(engine: LLMEngine, n: int, runs: int) -> float:
    """The best seconds of one n-token prefill (the request's first and only token)."""
    engine.generate(prompts(64, 1, 1), SamplingParams(max_tokens=1))  # warm up
    best = math.inf
    for p in prompts(n, runs, 2):
        t = time.perf_counter()
        engine.generate([p], SamplingParams(max_tokens=1, temperature=0.0))
        best = min(best, time.perf_counter() - t)
    return best


def llamacpp_prefill(path: Path, n: int, runs: int) -> float:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=CONTEXT, n_threads=1, n_threads_batch=1, n_batch=512, n_ubatch=512,
                          flash_attn=True, verbose=False)
    best = math.inf
    for p in prompts(n, runs, 3):
        llm.reset()
        t = time.perf_counter()
        llm.eval(p)
        best = min(best, time.perf_counter() - t)
    llm.close()
    return best


def decode_step_ms(engine: LLMEngine, batch: int, steps: int) -> float:
    """Median CPU ms of a decode-only step with `batch` sequences (prefills done first)."""
    params = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts(32, batch, 10 + batch)):
        engine.add_request(f"d{batch}-{i}", p, params)
    while any(seq.num_completion_tokens == 0 for seq in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    times = []
    for _ in range(steps):
        t = time.process_time()
        engine.step()
        times.append(time.process_time() - t)
    while engine.has_unfinished_requests():
        engine.step()
    return 1000 * statistics.median(times)


def stalled_share(prefill_s: float, every_s: float, step_ms: float) -> tuple[float, float]:
    """A co-located runner (half the prompts, 4 streams): (the share of its streams' gaps that a prefill
    stalls, the share of its time it prefills). A prompt's prefill is one step (it fits the 2,048-token
    budget) and one long gap for each stream; the rest of the time the streams step at ``step_ms``."""
    busy = prefill_s / (2 * every_s)
    stalled = (STREAMS // 2) / (2 * every_s)  # long gaps a second
    plain = (STREAMS // 2) * max(0.0, 1 - busy) / (step_ms / 1000)
    return stalled / (stalled + plain), busy


def goodput_ideal(prefill_s: float, every_s: float, step4_ms: float, step8_ms: float) -> tuple[float, float]:
    """Requests a second each side finishes at this load with nothing but its engine steps (no stall past
    the prefill's own time, no transfer, no gateway): (co-located, 1P+1D). Both finish every long prompt
    (``1 / every``); the streams (``STREAM_TOKENS`` each) decode at 4 a runner on two runners for the time
    their runner does not prefill, or at 8 on 1P+1D's decode core all the time."""
    busy = min(1.0, prefill_s / (2 * every_s))
    longs = 1 / every_s
    colocated = longs + 2 * (STREAMS // 2) * (1 - busy) / (step4_ms / 1000) / STREAM_TOKENS
    return colocated, longs + STREAMS / (step8_ms / 1000) / STREAM_TOKENS


def gemm_gflops(rows: int, k: int, n: int, dtype: torch.dtype) -> float:
    a, b = torch.randn(rows, k).to(dtype), torch.randn(n, k).to(dtype)
    for _ in range(3):
        a @ b.t()
    best = math.inf
    for _ in range(7):
        t = time.perf_counter()
        a @ b.t()
        best = min(best, time.perf_counter() - t)
    return 2 * rows * k * n / best / 1e9


def wide_peaks() -> dict[str, float | None]:
    """GFLOP/s of bench/prefill_peak.c's instructions (None: not on this CPU or this compiler)."""
    found: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        lib_path = Path(tmp) / "prefill_peak.so"
        subprocess.run(["cc", "-O3", "-march=native", "-shared", "-fPIC", "-o", str(lib_path),
                        str(ROOT / "bench" / "prefill_peak.c")], check=True)
        lib = ctypes.CDLL(str(lib_path))
        amx = hasattr(lib, "amx_request") and lib.amx_request() == 0
        for name, function, macs, rounds, needs_amx in (
                ("vpdpbusd zmm (int8)", "peak_dpbusd", 8 * 64, 2_000_000, False),
                ("AMX tdpbssd (int8)", "peak_tdpbssd", 4 * 16 * 16 * 64, 200_000, True),
                ("AMX tdpbf16ps (bf16)", "peak_tdpbf16ps", 4 * 16 * 16 * 32, 200_000, True)):
            if not hasattr(lib, function) or (needs_amx and not amx):
                found[name] = None
                continue
            fn = getattr(lib, function)
            fn.argtypes, fn.restype = (ctypes.c_int64,), ctypes.c_int64
            fn(rounds)
            best = math.inf
            for _ in range(7):
                t = time.perf_counter()
                fn(rounds)
                best = min(best, time.perf_counter() - t)
            found[name] = 2 * macs * rounds / best / 1e9
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--long-prompt", type=int, default=2000)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--core", type=int, default=os.cpu_count() - 1)
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.core})
    torch.set_num_threads(1)
    path = fetch_smollm2()
    engine = LLMEngine.from_model(str(path), max_model_len=CONTEXT)
    cfg, n = engine.model_runner.model_config, args.long_prompt
    flop = flops_per_token(cfg, n)
    required = n / args.every
    achieved = {F32: n / native_prefill(engine, n, args.runs)}
    bf16 = LLMEngine.from_model(str(path), max_model_len=CONTEXT, kv_cache_memory_bytes=256 << 20,
                                cpu_bf16_prefill=True)
    if bf16.model_runner.extra_weight_bytes:  # 0: this CPU could not prove it, the engine kept f32
        achieved[BF16] = n / native_prefill(bf16, n, args.runs)
    del bf16
    achieved["llama.cpp (1 thread)"] = n / llamacpp_prefill(path, n, args.runs)
    step4, step8 = (decode_step_ms(engine, b, args.steps) for b in (STREAMS // 2, STREAMS))
    gate_up = (n, cfg.hidden_size, 2 * cfg.intermediate_size)
    ceilings = {"vpdpwssd zmm (int16, ours)": peak("peak_dpwssd", "native", 8 * 32), **wide_peaks(),
                f"torch f32 GEMM {gate_up}": gemm_gflops(*gate_up, torch.float32),
                f"torch bf16 GEMM {gate_up}": gemm_gflops(*gate_up, torch.bfloat16)}
    report(args, cfg, flop, required, achieved, ceilings, step4, step8)


def report(args, cfg, flop: float, required: float, achieved: dict[str, float], ceilings: dict[str, float | None],
           step4: float, step8: float) -> None:
    g = lambda rate: rate * flop / 1e9  # noqa: E731  tok/s -> GFLOP/s
    print(f"SmolLM2-135M ({cfg.num_layers} layers, hidden {cfg.hidden_size}): {flop / 1e6:.0f} MFLOP a token "
          f"of a {args.long_prompt}-token prompt; one core (cpu {args.core}), one thread")
    print(f"required  {required:8.0f} tok/s  {g(required):7.1f} GFLOP/s   ({args.long_prompt} tokens every "
          f"{args.every:g} s onto one prefill core)")
    for name, rate in achieved.items():
        print(f"achieved  {rate:8.0f} tok/s  {g(rate):7.1f} GFLOP/s   {name}: {rate / required:.2f}x required, "
              f"prefill core utilisation {required / rate:.2f}{' (queue unbounded)' if required > rate else ''}")
    for name, rate in ceilings.items():
        shown = f"{rate:7.1f} GFLOP/s = {rate * 1e9 / flop:8.0f} tok/s" if rate else "    n/a (not on this CPU)"
        print(f"ceiling   {shown}   {name}" + (f": {rate / g(required):.2f}x required" if rate else ""))
    print(f"decode step, one core: batch {STREAMS // 2} {step4:.1f} ms, batch {STREAMS} {step8:.1f} ms "
          f"({step8 / step4:.2f}x): 1P+1D's decode runner (8 streams) vs each co-located one (4)")
    for name in (F32, BF16):
        if name not in achieved:
            continue
        share, busy = stalled_share(args.long_prompt / achieved[name], args.every, step4)
        print(f"co-located ({name}): each runner prefills a {args.long_prompt}-token prompt every "
              f"{2 * args.every:g} s, {100 * min(busy, 1):.0f} % of its time{' (overloaded)' if busy >= 1 else ''}; "
              f"the stalled gaps are {100 * share:.2f} % of its ITLs: P99 ITL sees the stalls only above 1 %")
        colocated, pd = goodput_ideal(args.long_prompt / achieved[name], args.every, step4, step8)
        print(f"goodput with nothing but engine steps ({name}): co-located {colocated:.2f} req/s, 1P+1D "
              f"{pd:.2f} req/s: 1P+1D / co-located {pd / colocated:.2f}x (goal >= 1.2)"
              + ("; but 1P+1D's prefill queue is unbounded: neither side carries the load" if busy >= 0.5 else ""))

if __name__ == "__main__":
    main()
