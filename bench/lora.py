"""LoRA on the native engine, SmolLM2-135M-Instruct (Q4_1 GGUF) on the CPU: what serving adapters costs.

One engine (`infer serve`'s settings: the engine's defaults, a 2048-token context, `max_loras` 8) and eight
random rank-16 adapters over all seven projections (`infer dev make-lora --base`). Four loads, each 16
requests at once (prompts 32..128 tokens, 32..64 greedy output tokens, ignore_eos), run alternately
(base, eight adapters, one adapter, base on the per-layer path, base, ...) so a busy neighbour slows all;
medians over `--runs`:

1. output tok/s, 16 requests over 8 adapters (two each) / the same load on the base: goal >= 0.8;
2. output tok/s, one adapter for all 16 / the base: goal >= 0.9;
3. TTFT of a 512-token prompt (max_tokens 1) through a resident adapter / the base: goal <= 1.10.

A decode step runs the whole model in one C call (`models/cpu_decode.py`), adapters included (each linear's
shrink and expand inside the step); prefills take the per-layer path, where each linear's tiled
matmul adds its adapter rows in the same C call (`tiled_matmul_lora`, lora/punica.py). The fourth load, the base
forced onto the per-layer path, shows what the C step is worth.

Each load's fastest decode step of all 16 requests is reported too (min over every run's steps): the figure a
busy neighbour disturbs least, when the machine is shared. Against it, the bytes such a step reads (the tiled
decoder weights and the LM head's blocks, plus per adapter of the load its A rows and the non-zero blocks of its Bᵀ,
as stored: float16) and the read bandwidth measured in the same run (`torch.sum` over a float32 buffer of the
eight-adapter step's size, the engine's threads, median of 7): bytes / step time as a share of it says how
far a step is from the memory's ceiling.

Every run's prompts start with a token of their own, so no run reuses another's prefix cache. Each figure
is given twice: by wall time, and by the process's CPU time (tokens per CPU second, as `bench/native_cpu.py`
measures), which a busy neighbour on a shared machine disturbs far less; the goals are read on the latter.

    flock /tmp/infer-heavy.lock .venv/bin/python bench/lora.py [--runs 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from native_engine import LLMEngine, LoRARequest, SamplingParams
from registry.modelbuilder import LoraSpec, build_lora, spec_from_gguf
from registry.realmodels import fetch_smollm2

CORPUS = Path(__file__).resolve().parents[1] / "registry" / "modelbuilder" / "data" / "corpus.txt"
NUM_ADAPTERS, RANK, NUM_REQUESTS = 8, 16, 16


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


class Prompts:
    """Prompts of the corpus; each `batch` and `single` starts with a token no other prompt starts with."""

    def __init__(self, tokenizer, quick: bool) -> None:
        self.ids = tokenizer.encode(CORPUS.read_text(), add_bos=False)
        self.rng = random.Random(0)
        self.firsts = iter(self.rng.sample(sorted(set(self.ids)), 512))
        lengths = random.Random(1234)
        n, (p_lo, p_hi), (o_lo, o_hi) = (4, (32, 64), (16, 32)) if quick else (NUM_REQUESTS, (32, 128), (32, 64))
        self.lengths = [lengths.randint(p_lo, p_hi) for _ in range(n)]
        self.outputs = [lengths.randint(o_lo, o_hi) for _ in range(n)]
        self.starts = [self.rng.randrange(len(self.ids) - 512) for _ in range(n + 1)]

    def batch(self) -> list[list[int]]:
        return [[next(self.firsts)] + self.ids[s : s + n - 1] for s, n in zip(self.starts, self.lengths)]

    def single(self, n: int) -> list[int]:
        return [next(self.firsts)] + self.ids[self.starts[-1] : self.starts[-1] + n - 1]


def throughput(engine: LLMEngine, prompts: list[list[int]], outputs: list[int], loras: list,
               per_layer: bool = False) -> float:
    model = engine.model_runner.model.model
    cpu_decode = model.cpu_decode
    model.cpu_decode = None if per_layer else cpu_decode
    try:
        return _throughput(engine, prompts, outputs, loras)
    finally:
        model.cpu_decode = cpu_decode


def _throughput(engine: LLMEngine, prompts: list[list[int]], outputs: list[int], loras: list
                ) -> tuple[float, float, float]:
    """(output tokens per wall second, per CPU second of this process, the fastest decode step of every request
    in seconds: a step after all prefills that gave each request a token; the least disturbed by neighbours)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for i, (p, n, lora) in enumerate(zip(prompts, outputs, loras, strict=True)):
        engine.add_request(f"b{i}-{time.monotonic_ns()}", p, greedy(n), lora_request=lora)
    generated, started, fastest = 0, set(), float("inf")
    while engine.has_unfinished_requests():
        s0 = time.perf_counter()
        step = engine.step()
        took = time.perf_counter() - s0
        if len(started) == len(prompts) and len(step) == len(prompts):
            fastest = min(fastest, took)
        started |= {out.request_id for out in step}
        generated += sum(len(out.outputs[0].token_ids) for out in step)
    assert generated == sum(outputs)
    return generated / (time.perf_counter() - t0), generated / (time.process_time() - c0), fastest


def ttft(engine: LLMEngine, prompt: list[int], lora) -> tuple[float, float]:
    """(wall seconds, CPU seconds) to the first token."""
    t0, c0 = time.perf_counter(), time.process_time()
    engine.add_request(f"t{time.monotonic_ns()}", prompt, greedy(1), lora_request=lora)
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - t0, time.process_time() - c0


def make_adapters(path: Path, root: Path) -> list[LoRARequest]:
    spec = spec_from_gguf(path)
    return [LoRARequest(f"a{i}", str(build_lora(root / f"a{i}.gguf", spec, LoraSpec(rank=RANK, alpha=RANK, seed=i))))
            for i in range(NUM_ADAPTERS)]


_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def base_bytes(engine: LLMEngine) -> int:
    """What a batched decode step reads of the base: every layer's tiled linears and the LM head's blocks."""
    lm = engine.model_runner.model
    layers = sum(layer.get_submodule(name).int4.tiled.nbytes for layer in lm.model.layers for name in _LINEARS)
    return layers + sum(w.tiled.nbytes if w.tiled is not None else w.nbytes for w in lm.lm_head.packed)


def adapter_bytes(engine: LLMEngine, name: str) -> int:
    """What a step reads of one resident adapter: per linear, its rank's rows of A and the blocks of its Bᵀ."""
    manager = engine.model_runner.lora
    slot, out = manager.slots[name], 0
    for linear in manager.linears.values():
        lora = linear.lora
        if lora.a is None or not lora.ranks[slot]:
            continue
        size = lora.a.element_size()
        out += lora.ranks[slot] * lora.a.shape[2] * size
        out += sum((c1 - c0) * (o1 - o0) for c0, c1, o0, o1 in lora.blocks[slot]) * size
    return out


def read_bandwidth(nbytes: int) -> float:
    """Bytes per second `torch.sum` reads from a float32 buffer of `nbytes` (median of 7)."""
    buf = torch.ones(nbytes // 4)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


def memory(engine: LLMEngine, adapters: list[LoRARequest], step: dict) -> dict:
    """Bytes a decode step of each load reads, and those bytes over its fastest step against the read bandwidth."""
    base, per_adapter = base_bytes(engine), [adapter_bytes(engine, a.lora_name) for a in adapters]
    reads = {"base": base, "eight": base + sum(per_adapter), "one": base + per_adapter[0]}
    bandwidth = read_bandwidth(reads["eight"])
    return {"step_bytes": reads, "read_bandwidth": bandwidth,
            "share_of_bandwidth": {k: reads[k] / step[k] / bandwidth for k in reads}}


def measure(engine: LLMEngine, adapters: list[LoRARequest], runs: int, quick: bool) -> dict:
    prompts = Prompts(engine.tokenizer, quick)
    n = len(prompts.lengths)
    loads = {"base": [None] * n, "eight": [adapters[i % NUM_ADAPTERS] for i in range(n)], "one": [adapters[0]] * n,
             "base_per_layer": [None] * n}
    for kind, loras in loads.items():  # warm-up: every adapter resident, the first-use paths taken
        throughput(engine, prompts.batch(), prompts.outputs, loras, per_layer=kind == "base_per_layer")
    rates: dict[str, list[tuple[float, float]]] = {k: [] for k in loads}
    for _ in range(runs):
        for kind, loras in loads.items():
            rates[kind].append(throughput(engine, prompts.batch(), prompts.outputs, loras,
                                          per_layer=kind == "base_per_layer"))
    firsts: dict[str, list[tuple[float, float]]] = {"base": [], "adapter": []}
    for _ in range(max(runs, 5)):
        firsts["base"].append(ttft(engine, prompts.single(128 if quick else 512), None))
        firsts["adapter"].append(ttft(engine, prompts.single(128 if quick else 512), adapters[1]))
    out = {"runs": rates, "ttft_runs": firsts, "adapter_loads": engine.model_runner.lora.num_loads}
    step = {k: min(v[2] for v in values) for k, values in rates.items()}
    out["decode_step_s"] = {**step, "eight_over_base": step["base"] / step["eight"],
                            "one_over_base": step["base"] / step["one"]}
    out["memory"] = memory(engine, adapters, step)
    for i, clock in enumerate(("wall", "cpu")):
        tok_s = {k: statistics.median(v[i] for v in values) for k, values in rates.items()}
        first = {k: statistics.median(v[i] for v in values) for k, values in firsts.items()}
        out[clock] = {"tok_s": tok_s, "ttft_s": first, "eight_over_base": tok_s["eight"] / tok_s["base"],
                      "one_over_base": tok_s["one"] / tok_s["base"],
                      "eight_over_base_per_layer": tok_s["eight"] / tok_s["base_per_layer"],
                      "base_per_layer_over_base": tok_s["base_per_layer"] / tok_s["base"],
                      "ttft_adapter_over_base": first["adapter"] / first["base"]}
    return out


def report(clock: str, r: dict, n: int) -> None:
    t, f = r["tok_s"], r["ttft_s"]
    unit = "tok/s" if clock == "wall" else "tok per CPU s"
    print(f"[{clock}] output {unit}, {n} requests: base {t['base']:.1f}, 8 adapters {t['eight']:.1f} "
          f"({r['eight_over_base']:.3f}x, goal >= 0.8), 1 adapter {t['one']:.1f} ({r['one_over_base']:.3f}x, "
          f"goal >= 0.9); base on the per-layer path {t['base_per_layer']:.1f} "
          f"({r['base_per_layer_over_base']:.3f}x base; 8 adapters / it {r['eight_over_base_per_layer']:.3f}x)")
    print(f"[{clock}] TTFT: base {f['base'] * 1e3:.1f} ms, resident adapter {f['adapter'] * 1e3:.1f} ms "
          f"({r['ttft_adapter_over_base']:.3f}x, goal <= 1.10)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="4 short requests (a smoke run)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    path = fetch_smollm2()
    with tempfile.TemporaryDirectory() as tmp:
        adapters = make_adapters(path, Path(tmp))
        engine = LLMEngine.from_model(path, max_model_len=2048, max_loras=NUM_ADAPTERS, device=args.device)
        result = measure(engine, adapters, args.runs, args.quick)
    for clock in ("wall", "cpu"):
        report(clock, result[clock], len(Prompts(engine.tokenizer, args.quick).lengths))
    step = result["decode_step_s"]
    print(f"[step] fastest decode step of all the requests: base {step['base'] * 1e3:.2f} ms, 8 adapters "
          f"{step['eight'] * 1e3:.2f} ms (base / it {step['eight_over_base']:.3f}x), "
          f"1 adapter {step['one'] * 1e3:.2f} ms "
          f"({step['one_over_base']:.3f}x), base on the per-layer path {step['base_per_layer'] * 1e3:.2f} ms")
    mem = result["memory"]
    reads, share = mem["step_bytes"], mem["share_of_bandwidth"]
    print(f"[memory] a step reads: base {reads['base'] / 1e6:.1f} MB, 8 adapters {reads['eight'] / 1e6:.1f} MB, "
          f"1 adapter {reads['one'] / 1e6:.1f} MB; read bandwidth {mem['read_bandwidth'] / 1e9:.1f} GB/s "
          f"(torch.sum over {reads['eight'] / 1e6:.0f} MB); bytes / fastest step: base {share['base']:.2f}, "
          f"8 adapters {share['eight']:.2f}, 1 adapter {share['one']:.2f} of it")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
