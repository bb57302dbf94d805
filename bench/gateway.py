"""What `infer serve` costs: TTFT and decode tok/s through the gateway vs llama-cpp-python directly.

Builds one GGUF with the project's model builder (default: Qwen2-0.5B shapes, q8_0, random
weights), installs it in a bench store, starts `infer serve` on a free loopback port, then
alternates in one run:

- direct:  ``llama_cpp.Llama(...).create_completion(prompt, stream=True)`` in this process
- gateway: ``POST /api/generate`` (``raw: true``, same prompt, streaming NDJSON) over HTTP

(Only one llama.cpp context lives in this process: a second one here, idle, slows the first one's
decode by a quarter on 2 cores, which would flatter the gateway.)

Both sides use greedy sampling, the same prompt tokens, ``--max-tokens`` new tokens and the same
thread count; a fresh prefix per run defeats the KV prefix cache on both sides. TTFT is measured by
the caller (for the gateway: from just before the POST to the first content line); decode tok/s is
(tokens - 1) / (last token time - first token time). Prints medians and ratios; goals: the gateway
costs <= 5 % of decode tok/s and <= 10 ms of TTFT.

    .venv/bin/python bench/gateway.py [--preset qwen2-0.5b] [--dtype q8_0] [--runs 5] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import llama_cpp  # noqa: E402

from ledger.db import open_db  # noqa: E402
from ledger.usage import recent  # noqa: E402
from registry.create import create_model  # noqa: E402
from registry.modelbuilder import PRESETS, build_gguf  # noqa: E402
from registry.modelfile import parse_modelfile  # noqa: E402
from registry.names import parse_name  # noqa: E402
from registry.store import Store  # noqa: E402
from fakes.live import start_server, stop_server  # noqa: E402

WORK = ROOT / ".bench" / "gateway"
PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle. "
          "Describe the weather, the sea and the keeper's thoughts in detail. ")


def build(preset: str, dtype: str, n_ctx: int) -> tuple[Store, Path]:
    gguf = WORK / f"{preset}-{dtype}.gguf"
    if not gguf.exists():
        print(f"building {gguf.name} (random weights) ...", flush=True)
        build_gguf(gguf, PRESETS[preset], dtype=dtype, seed=0)
    store = Store(WORK / "models")
    mf = parse_modelfile(f"FROM {gguf}\nPARAMETER num_ctx {n_ctx}\n")
    create_model(store, parse_name("bench", insecure=True), mf, WORK)
    return store, gguf


def run_direct(llm: llama_cpp.Llama, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    times = []
    for chunk in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, stream=True):
        if chunk["choices"][0]["finish_reason"] is None:  # the last chunk only carries the reason
            times.append(time.perf_counter())
    return _summary(t0, times)


def run_gateway(client: httpx.Client, url: str, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    body = {"model": "bench", "prompt": prompt, "raw": True, "stream": True,
            "options": {"num_predict": max_tokens, "temperature": 0.0}}
    t0 = time.perf_counter()
    times = []
    with client.stream("POST", url + "/api/generate", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            chunk = json.loads(line)
            if chunk.get("done"):
                break
            times.append(time.perf_counter())
    return _summary(t0, times)


def ledger_ttfts(db_url: str, n: int) -> list[float]:
    """TTFT of the last ``n`` requests as the server recorded them, oldest first, in seconds."""
    time.sleep(1.0)  # ledger rows are written asynchronously after each answer
    engine = open_db(db_url)
    try:
        rows = recent(engine, limit=n)
    finally:
        engine.dispose()
    return [r.ttft_ms / 1000 for r in reversed(rows)]


def _summary(t0: float, times: list[float]) -> tuple[float, float, int]:
    ttft = times[0] - t0
    tps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    return ttft, tps, len(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2-0.5b", choices=sorted(PRESETS))
    parser.add_argument("--dtype", default="q8_0", choices=["f32", "f16", "q8_0"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument("--prompt-repeat", type=int, default=3, help="prompt length: repeats of a 27-word text")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    store, gguf = build(args.preset, args.dtype, args.ctx)
    text = PROMPT * args.prompt_repeat
    threads = os.cpu_count() or 1
    llm = llama_cpp.Llama(str(gguf), n_ctx=args.ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
    server = start_server(WORK, store.root, INFER_KEEP_ALIVE="-1")
    results: dict[str, list[tuple[float, float, int]]] = {"direct": [], "gateway": []}
    try:
        with httpx.Client(timeout=600) as client:
            run_gateway(client, server.url, "warm up " + text, 4)  # load the model outside the timings
            run_direct(llm, "warm up " + text, 4)
            for i in range(args.runs):
                prompt = f"Run {i}. {text}"  # a new first token: no KV prefix reuse on either side
                results["direct"].append(run_direct(llm, prompt, args.max_tokens))
                results["gateway"].append(run_gateway(client, server.url, prompt, args.max_tokens))
                print(f"run {i + 1}: " + "  ".join(f"{k} ttft {v[-1][0] * 1e3:7.1f} ms, {v[-1][1]:6.1f} tok/s "
                                                  f"({v[-1][2]} tok)" for k, v in results.items()), flush=True)
        server_ttft = ledger_ttfts(server.db_url, args.runs)
    finally:
        stop_server(server)
    report(results, args, threads)
    http = statistics.median(g[0] - s_ for g, s_ in zip(results["gateway"], server_ttft))
    print(f"  client TTFT - the server's own TTFT (ledger, from route entry): {http * 1e3:+.1f} ms median "
          "(HTTP, JSON parsing and NDJSON framing, free of prefill jitter)")


def report(results: dict, args, threads: int) -> None:
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in results.items()}
    print(f"\nmodel {args.preset} {args.dtype}, {args.max_tokens} new tokens, {args.runs} runs, {threads} threads; medians:")
    for name, (ttft, tps) in med.items():
        print(f"  {name:8s} TTFT {ttft * 1e3:8.1f} ms   decode {tps:7.1f} tok/s")
    for ref in ("direct",):
        paired = statistics.median(g[0] - d[0] for d, g in zip(results[ref], results["gateway"]))
        print(f"  gateway vs {ref:7s}: TTFT {paired * 1e3:+6.1f} ms (median of per-run differences; goal <= 10 ms), "
              f"decode ratio {med['gateway'][1] / med[ref][1]:.3f} (goal >= 0.95)")


if __name__ == "__main__":
    main()
