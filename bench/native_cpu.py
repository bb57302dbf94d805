"""CPU time per decoded token, the native engine vs llama-cpp-python on SmolLM2-135M Q4_1 (same GGUF).

Wall-clock ratios swing a lot on a shared machine; the CPU time a process spends per token moves much
less, because waiting for a core is not counted. One process, both sides loaded once, then alternated:
each run decodes `--tokens` greedy tokens after a 17-token prompt (prompt included in the time), and
the medians are printed with their ratio. `--threads` is given to both sides (torch and llama.cpp).

    flock /tmp/infer-bench.lock .venv/bin/python bench/native_cpu.py [--threads 1] [--runs 3] [--tokens 65]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import native_smollm2 as smol  # noqa: E402  (bench/ is the script's directory)
from native_engine import LLMEngine
from registry.realmodels import fetch_smollm2


def cpu_ms_per_token(fn, n: int) -> float:
    start = time.process_time()
    fn()
    return (time.process_time() - start) / n * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=65)
    args = parser.parse_args()
    import llama_cpp

    torch.set_num_threads(args.threads)
    path = fetch_smollm2()
    engine = LLMEngine.from_model(path, **smol.SERVE)
    llm = llama_cpp.Llama(str(path), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    prompt, n = list(range(200, 216)), args.tokens
    smol.ours_stream(engine, prompt, 8), smol.llama_stream(llm, prompt, 8)  # warm up
    ours, llama = [], []
    for i in range(args.runs):
        ours.append(cpu_ms_per_token(lambda: smol.ours_stream(engine, [9 + i] + prompt, n), n))
        llama.append(cpu_ms_per_token(lambda: smol.llama_stream(llm, [9 + i] + prompt, n), n))
    o, l = statistics.median(ours), statistics.median(llama)
    print(f"threads {args.threads}: CPU ms/token ours {o:.2f} {[round(v, 2) for v in ours]}, "
          f"llama.cpp {l:.2f} {[round(v, 2) for v in llama]}; ours / llama.cpp {o / l:.2f}x (lower is better)")


if __name__ == "__main__":
    main()
