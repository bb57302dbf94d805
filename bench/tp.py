"""Tensor parallelism on the CPU: SmolLM2-135M-Instruct (Q4_1) on two ranks (gloo) against one.

Both sides hold the machine's cores: one rank with every core as torch threads, or two rank processes
with half the cores each. Three engines, built once and measured alternately (a busy neighbour slows
each alike), medians over ``--runs``:

- ``tp1``: one rank, the engine's default CPU path (decode steps of 1-3 rows as one C call for the whole
  stack, `models/cpu_decode.py`);
- ``tp1-layers``: one rank through the layer-by-layer path the ranks of a group take (the same kernels,
  no whole-stack C call): the like-for-like reference for what splitting costs and saves;
- ``tp2``: two ranks: 6 + 3 query heads (2 + 1 KV heads), MLP and vocabulary in halves.

Accuracy first: per-position KL between one and two ranks on a 90-token chat text, on the float32 path
(weights dequantized, `cpu_int4_matmul=False`; goal < 1e-9) and on the default path (int16 activations in
the kernels, whose rounding a reordered sum can flip), and whether 64 greedy tokens are the same.

Workloads: decode tok/s at batch 1 and 16 (``--tokens`` greedy tokens after a 16-token prompt; the step
time of the decode steps), and the time of one 256-token prefill. For ``tp2``, rank 0 times every
collective it takes part in (gloo all-reduce after each row-parallel linear and the embedding, the logits
gather): count, time, bytes per step; the time per layer is the two all-reduces of one layer. On this
shared 2-core machine a collective's time is mostly waiting for the other process to be scheduled and
for loopback TCP, not moving bytes.

    .venv/bin/python bench/tp.py [--runs 3] [--tokens 32] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from native_engine import LLMEngine, SamplingParams  # noqa: E402
from noise import cpu_ticks  # noqa: E402  (bench/ is the script's directory)
from registry.realmodels import fetch_smollm2  # noqa: E402

KW = dict(max_num_seqs=16, max_model_len=1024, kv_cache_memory_bytes=64 << 20, max_num_batched_tokens=512)
BATCHES = (1, 16)
PREFILL = 256


def threads(name: str) -> int:
    """This process's torch threads for the engine (process-wide: set again before each engine runs)."""
    cores = os.cpu_count() or 1
    return max(1, cores // 2) if name == "tp2" else cores


def build(path: Path, name: str) -> LLMEngine:
    if name == "tp2":
        return LLMEngine.from_model(path, tensor_parallel_size=2, num_threads=threads(name), **KW)
    engine = LLMEngine.from_model(path, num_threads=threads(name), **KW)
    if name == "tp1-layers":
        engine.model_runner.model.model.cpu_decode = None  # the layer-by-layer path of a group's ranks
    return engine


def decode(engine: LLMEngine, batch: int, tokens: int, prompt: list[int]) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"d{batch}-{i}-{time.monotonic_ns()}", [prompt[0] + i, *prompt[1:]], params)
    engine.step()  # the prefill
    stats = engine.tp.stats if engine.tp else None
    if stats:
        stats.reset()
    steps = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t0)
    step = statistics.median(steps)
    out = {"step_ms": 1e3 * step, "tok_s": batch / step}
    if stats:
        out.update(collectives(stats, len(steps), engine.model_config.num_layers))
    return out


def collectives(stats, steps: int, layers: int) -> dict:
    per_step = stats.seconds / steps
    return {"collectives_per_step": stats.count / steps, "collective_ms_per_step": 1e3 * per_step,
            "collective_us_each": 1e6 * stats.seconds / max(1, stats.count),
            "collective_us_per_layer": 2e6 * stats.seconds / max(1, stats.count),
            "collective_kib_per_step": stats.bytes / steps / 1024}


def prefill(engine: LLMEngine, prompt: list[int]) -> dict:
    if engine.tp:
        engine.tp.stats.reset()
    t0 = time.perf_counter()
    engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1))
    out = {"ms": 1e3 * (time.perf_counter() - t0)}
    if engine.tp:
        out.update(collectives(engine.tp.stats, 1, engine.model_config.num_layers))
    return out


def machine_load(before: tuple[int, int], pids: list[int], spent_ticks: int, seconds: float) -> float:
    """Cores that processes other than ours (this one and its ranks) kept busy."""
    after = cpu_ticks()
    ours = (after[1] - before[1]) + spent_ticks
    return max(0, after[0] - before[0] - ours) / os.sysconf("SC_CLK_TCK") / seconds


def rank_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total


def median_of(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
TEXT = CHAT + ("The capital of France is Paris. It is known for the Eiffel Tower, the Louvre and its cafés; "
               "about two million people live in the city itself, and more than twelve million in the region.")


def kl(reference: torch.Tensor, ours: torch.Tensor) -> torch.Tensor:
    ref, mine = reference.double().log_softmax(-1), ours.double().log_softmax(-1)
    return (ref.exp() * (ref - mine)).sum(-1)


def accuracy(path: Path, engines: dict) -> dict:
    """KL between one and two ranks (float32 path and default path) and the 64 greedy tokens of each."""
    tokenizer = engines["tp1"].tokenizer
    text, chat = tokenizer.encode(TEXT, add_bos=False), tokenizer.encode(CHAT, add_bos=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    f32 = [LLMEngine.from_model(path, cpu_int4_matmul=False, tensor_parallel_size=n, num_threads=threads(name), **KW)
           for n, name in ((1, "tp1"), (2, "tp2"))]
    out = {}
    for label, (one, two) in (("f32", f32), ("default", (engines["tp1"], engines["tp2"]))):
        k = kl(one.score(text), two.score(text))
        same = [e.generate([chat], greedy)[0].outputs[0].token_ids for e in (one, two)]
        out[label] = {"kl_mean": float(k.mean()), "kl_max": float(k.max()), "same_64_greedy": same[0] == same[1]}
    for engine in f32:
        engine.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    path = fetch_smollm2()
    engines = {name: build(path, name) for name in ("tp1", "tp1-layers", "tp2")}
    tokenizer = engines["tp1"].tokenizer
    text = (ROOT / "registry" / "modelbuilder" / "data" / "corpus.txt").read_text()
    ids = tokenizer.encode(text, add_bos=False)
    short, long = ids[:16], ids[100 : 100 + PREFILL]
    pids = [p.pid for p in engines["tp2"].tp.workers]
    exact = accuracy(path, engines)
    results: dict = {name: {f"batch{b}": [] for b in BATCHES} | {"prefill": []} for name in engines}
    before, ticks0, t0 = cpu_ticks(), rank_ticks(pids), time.perf_counter()
    for _ in range(args.runs):
        for name, engine in engines.items():
            torch.set_num_threads(threads(name))
            for b in BATCHES:
                results[name][f"batch{b}"].append(decode(engine, b, args.tokens, short))
            results[name]["prefill"].append(prefill(engine, long))
    load = machine_load(before, pids, rank_ticks(pids) - ticks0, time.perf_counter() - t0)
    summary = {name: {k: median_of(v) for k, v in r.items()} for name, r in results.items()}
    summary["others_cores"] = load
    summary["accuracy"] = exact
    report(summary, args)
    for engine in engines.values():
        engine.close()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1))


def report(s: dict, args) -> None:
    cores = os.cpu_count()
    print(f"\nSmolLM2-135M Q4_1 on the CPU ({cores} cores), tensor parallel 2 ranks (gloo) vs 1; medians of "
          f"{args.runs} runs, {args.tokens} greedy tokens; other processes used {s['others_cores']:.2f} cores")
    for label, a in s["accuracy"].items():
        print(f"  {label} path, 1 vs 2 ranks: KL mean {a['kl_mean']:.2g}, max {a['kl_max']:.2g}; "
              f"64 greedy tokens {'identical' if a['same_64_greedy'] else 'DIFFERENT'}")
    print(f"  {'':12s} {'b1 tok/s':>9s} {'b16 tok/s':>10s} {'prefill ms':>11s}")
    for name in ("tp1", "tp1-layers", "tp2"):
        r = s[name]
        print(f"  {name:12s} {r['batch1']['tok_s']:9.1f} {r['batch16']['tok_s']:10.1f} {r['prefill']['ms']:11.1f}")
    tp2 = s["tp2"]
    for ref in ("tp1", "tp1-layers"):
        ratios = [tp2[f"batch{b}"]["tok_s"] / s[ref][f"batch{b}"]["tok_s"] for b in BATCHES]
        print(f"  tp2 / {ref}: decode b1 {ratios[0]:.2f}x, b16 {ratios[1]:.2f}x; prefill time "
              f"{tp2['prefill']['ms'] / s[ref]['prefill']['ms']:.2f}x")
    print("  tp2 collectives (rank 0's view: gloo all-reduce / gather, waiting for the other rank included):")
    for key in ("batch1", "batch16", "prefill"):
        c = tp2[key]
        step = c.get("step_ms", c.get("ms"))
        print(f"    {key:8s} {c['collectives_per_step']:.0f} per step, {c['collective_us_each']:.0f} us each, "
              f"{c['collective_us_per_layer']:.0f} us per layer (2 all-reduces), {c['collective_ms_per_step']:.1f} ms "
              f"of a {step:.1f} ms step ({100 * c['collective_ms_per_step'] / step:.0f}%), "
              f"{c['collective_kib_per_step']:.0f} KiB")


if __name__ == "__main__":
    main()
