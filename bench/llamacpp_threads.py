"""Why each llama.cpp context has its own thread (adapters/engines/llamacpp/pool.py): SmolLM2-135M Q4_1's greedy
decode tok/s in one process, called from the main thread, then from three other threads in turn, then from the
main thread again. GNU OpenMP keeps a worker team per calling thread; once the process has more OpenMP threads
than cores its barriers stop spinning ("throttled"), and every later call is slower, the first thread's too.

    flock /tmp/infer-heavy.lock .venv/bin/python bench/llamacpp_threads.py [--tokens 128]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def decode_rate(llm, tokens: int) -> float:
    prompt = llm.tokenize(b"Tell me a long story about a dragon.")
    first = None
    for n, _ in enumerate(llm.generate(prompt, temp=0.0, reset=True), start=1):
        if n == 1:
            first = time.perf_counter()
        if n > tokens:
            break
    return tokens / (time.perf_counter() - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    import llama_cpp

    from registry.realmodels import fetch_smollm2

    threads = os.cpu_count() or 1
    llm = llama_cpp.Llama(model_path=str(fetch_smollm2()), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    rows = [("main thread", decode_rate(llm, args.tokens))]
    pools = [ThreadPoolExecutor(1) for _ in range(3)]  # kept alive: their OpenMP teams stay
    rows += [(f"thread {i + 1}", pool.submit(decode_rate, llm, args.tokens).result()) for i, pool in enumerate(pools)]
    rows.append(("main thread again", decode_rate(llm, args.tokens)))
    print(f"SmolLM2-135M Q4_1, {threads} llama.cpp threads, greedy, {args.tokens} tokens, one context")
    for name, rate in rows:
        print(f"  {name:18s} {rate:7.1f} tok/s  {rate / rows[0][1]:5.2f}x the first")


if __name__ == "__main__":
    main()
