"""The native engine vs llama-cpp-python on a real model: SmolLM2-135M-Instruct, the same Q4_1 GGUF.

Both sides are loaded once in one process and measured alternately (ours, llama.cpp, ours, ...), so
a busy neighbour slows both; figures are medians over ``runs``.

1. load: a fresh `LLMEngine` with `infer serve`'s settings (the engine's defaults, a 2048-token context) vs
   a fresh `llama_cpp.Llama` (n_ctx 2048). Goal: ours <= 2 s.
2. single-stream decode: 16-token prompt, 128 greedy tokens; tok/s = (n - 1) / (last - first token
   time). Goal ours / llama.cpp >= 1.0.
3. mixed: 16 requests (prompts 32..256 tokens, outputs 64..128, ignore_eos); ours all at once,
   llama.cpp one after another; output tok/s. Goal ours / llama.cpp >= 4. Ours again with Ollama's
   default sampling (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1), alternated with the
   greedy runs; goal sampled / greedy >= 0.85. And ours greedy with a JSON schema on every request (a string
   field of at least 1000 characters, so each runs to max_tokens): goal schema / plain >= 0.90.
4. TTFT of a 512-token prompt (max_tokens = 1). Goal ours / llama.cpp <= 1.0.
5. accuracy on a 90-token chat text: per-position KL of ours (default path) and of llama.cpp
   against the exact f32 path (dequantized weights, `cpu_int4_matmul=False`, itself equal to
   transformers to KL < 1e-9 in tests/realmodel); goal mean < 1e-3 and max no worse than llama.cpp's;
   the same KL for ours at the decode steps of a 48-token greedy answer (decode steps compute apart from
   a prefill: `llama_decode_rows`, int16-rounded matmul inputs); and the greedy answer to "What is the
   capital of France?" of each.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from dataclasses import dataclass

from pathlib import Path

import torch

from native_engine import LLMEngine, SamplingParams, StructuredOutputsParams
from registry.realmodels import fetch_smollm2

CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
TEXT = CHAT + ("The capital of France is Paris. It is known for the Eiffel Tower, the Louvre and its cafés; "
               "about two million people live in the city itself, and more than twelve million in the region.")
CORPUS = Path(__file__).resolve().parents[1] / "registry" / "modelbuilder" / "data" / "corpus.txt"
MIXED_RUNS = 2
SERVE = dict(max_model_len=2048)  # infer serve's context (LocalSettings.context_length); the rest: EngineConfig's


@dataclass(slots=True)
class Workload:
    single: list[int]
    ttft: list[list[int]]
    mixed: list[list[list[int]]]  # one set of prompts per mixed run: the same lengths, no prefix shared
    outputs: list[int]


def workload(tokenizer, runs: int, quick: bool) -> Workload:
    ids = tokenizer.encode(CORPUS.read_text(), add_bos=False)
    rng, lengths = random.Random(0), random.Random(1234)
    firsts = iter(rng.sample(sorted(set(ids)), 128))  # a distinct first token per prompt: no prefix reuse

    def prompt(n: int) -> list[int]:
        start = rng.randrange(len(ids) - n)
        return [next(firsts)] + ids[start : start + n - 1]

    n, (p_lo, p_hi), (o_lo, o_hi) = (4, (32, 64), (16, 32)) if quick else (16, (32, 256), (64, 128))
    first = [prompt(lengths.randint(p_lo, p_hi)) for _ in range(n)]
    # Each later run: the same prompts under a fresh first token, so the prefix cache (ours; llama.cpp's is
    # reset per request) cannot skip a prefill a previous run did.
    # Runs MIXED_RUNS.. are the sampled ones and 2 * MIXED_RUNS.. the structured ones, on prompts of their own.
    mixed = [first] + [[[next(firsts)] + p[1:] for p in first] for _ in range(3 * MIXED_RUNS - 1)]
    return Workload(prompt(16), [prompt(128 if quick else 512) for _ in range(runs)], mixed,
                    [lengths.randint(o_lo, o_hi) for _ in range(n)])


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def ollama_sampling(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1, max_tokens=n, ignore_eos=True)


LONG_TEXT = {"type": "object", "properties": {"text": {"type": "string", "minLength": 1000}}, "required": ["text"]}


def json_schema(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True,
                          structured_outputs=StructuredOutputsParams(json=LONG_TEXT))


def rate(times: list[float]) -> float:
    return (len(times) - 1) / (times[-1] - times[0])


# -- one measurement per side ---------------------------------------------------------------------


def ours_stream(engine: LLMEngine, prompt: list[int], n: int) -> tuple[float, list[float]]:
    t0, times = time.perf_counter(), []
    engine.add_request(f"s{time.monotonic_ns()}", prompt, greedy(n))
    while engine.has_unfinished_requests():
        for out in engine.step():
            times += [time.perf_counter()] * len(out.outputs[0].token_ids)
    return t0, times


def ours_mixed(engine: LLMEngine, w: Workload, run: int, params=greedy) -> float:
    t0 = time.perf_counter()
    for i, (p, n) in enumerate(zip(w.mixed[run], w.outputs, strict=True)):
        engine.add_request(f"m{i}-{time.monotonic_ns()}", p, params(n))
    generated = 0
    while engine.has_unfinished_requests():
        generated += sum(len(out.outputs[0].token_ids) for out in engine.step())
    assert generated == sum(w.outputs)
    return generated / (time.perf_counter() - t0)


def llama_stream(llm, prompt: list[int], n: int) -> tuple[float, list[float]]:
    llm.reset()
    t0, times = time.perf_counter(), []
    for _ in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        times.append(time.perf_counter())
        if len(times) == n:
            break
    return t0, times


def llama_mixed(llm, w: Workload, run: int) -> float:
    t0 = time.perf_counter()
    generated = sum(len(llama_stream(llm, p, n)[1]) for p, n in zip(w.mixed[run], w.outputs, strict=True))
    return generated / (time.perf_counter() - t0)


# -- accuracy -------------------------------------------------------------------------------------


def kl(reference: torch.Tensor, ours: torch.Tensor) -> torch.Tensor:
    ref, mine = reference.double().log_softmax(-1), ours.double().log_softmax(-1)
    return (ref.exp() * (ref - mine)).sum(-1)


def llama_logits(llm, ids: list[int]) -> torch.Tensor:
    llm.reset()
    llm.eval(ids)
    return torch.tensor(llm.scores[: len(ids)]).float()


def decode_kl(engine: LLMEngine, exact: LLMEngine, prompt: list[int], n: int) -> torch.Tensor:
    """KL of ours against the exact path at the decode steps of a greedy answer (the prefill's row left out)."""
    model, rows = engine.model_runner.model, []
    compute_logits = model.compute_logits
    model.compute_logits = lambda hidden, ctx: rows.append(compute_logits(hidden, ctx)) or rows[-1]
    try:
        tokens = engine.generate([prompt], greedy(n))[0].outputs[0].token_ids
    finally:
        del model.compute_logits
    ref = exact.model_runner.score(prompt + tokens)[len(prompt) - 1 : len(prompt) - 1 + n]
    return kl(ref[1:], torch.cat(rows[1:]))


def accuracy(path, engine: LLMEngine, llm_all) -> dict:
    exact = LLMEngine.from_model(path, dtype="float32", cpu_int4_matmul=False, max_num_seqs=2, max_model_len=512,
                                 kv_cache_memory_bytes=16 << 20)
    ids = exact.tokenizer.encode(TEXT, add_bos=False)
    ref = exact.model_runner.score(ids)
    ours_kl, llama_kl = kl(ref, engine.model_runner.score(ids)), kl(ref, llama_logits(llm_all, ids))
    chat = exact.tokenizer.encode(CHAT, add_bos=False)
    answer = lambda e: e.generate([chat], SamplingParams(temperature=0.0, max_tokens=16))[0].outputs[0].text  # noqa: E731
    llm_all.reset()
    llama_answer = llm_all.detokenize([t for _, t in zip(range(16), llm_all.generate(
        chat, temp=0.0, top_k=1, repeat_penalty=1.0))]).decode("utf-8", errors="replace")
    dec_kl = decode_kl(engine, exact, chat, 48)
    out = {"positions": len(ids), "ours_kl_mean": float(ours_kl.mean()), "ours_kl_max": float(ours_kl.max()),
           "decode_positions": len(dec_kl), "ours_decode_kl_mean": float(dec_kl.mean()),
           "ours_decode_kl_max": float(dec_kl.max()),
           "llama_kl_mean": float(llama_kl.mean()), "llama_kl_max": float(llama_kl.max()),
           "f32_answer": answer(exact), "ours_answer": answer(engine), "llama_answer": llama_answer}
    del exact
    gc.collect()
    return out


# -- the run --------------------------------------------------------------------------------------


def load_times(path, runs: int, threads: int) -> tuple[float, float]:
    import llama_cpp

    ours, llama = [], []
    for _ in range(runs):
        t = time.perf_counter()
        engine = LLMEngine.from_model(path, **SERVE)
        ours.append(time.perf_counter() - t)
        del engine
        gc.collect()
        t = time.perf_counter()
        llm = llama_cpp.Llama(str(path), n_ctx=2048, n_threads=threads, verbose=False)
        llama.append(time.perf_counter() - t)
        llm.close()
    return statistics.median(ours), statistics.median(llama)


def run(runs: int, threads: int, quick: bool) -> dict:
    import llama_cpp

    path = fetch_smollm2()
    res: dict = {"model": "SmolLM2-135M-Instruct Q4_1", "threads": threads}
    res["load_ours_s"], res["load_llama_s"] = load_times(path, runs, threads)
    engine = LLMEngine.from_model(path, **SERVE)
    llm = llama_cpp.Llama(str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    w = workload(engine.tokenizer, runs, quick)
    n = 32 if quick else 128
    warm = [w.single[0]] + w.mixed[0][0][1:24]  # no block shared with a measured prompt
    ours_stream(engine, warm, 8), llama_stream(llm, warm, 8)  # warm up
    engine.generate([[w.single[1]] + warm[1:20]], ollama_sampling(4))  # and the sampler's state
    engine.generate([[w.single[2]] + warm[1:20]], json_schema(4))  # and the grammar's tokenizer
    dec, ttft, mixed, sampled, structured = ([], []), ([], []), ([], []), [], []
    for i in range(runs):  # alternate the sides within every run
        dec[0].append(rate(ours_stream(engine, [9 + i] + w.single[1:], n)[1]))
        dec[1].append(rate(llama_stream(llm, [9 + i] + w.single[1:], n)[1]))
        for side, fn in enumerate((ours_stream, llama_stream)):
            t0, times = fn(engine if side == 0 else llm, w.ttft[i], 1)
            ttft[side].append(times[0] - t0)
        if i < (1 if quick else MIXED_RUNS):
            mixed[0].append(ours_mixed(engine, w, i))
            mixed[1].append(llama_mixed(llm, w, i))
            sampled.append(ours_mixed(engine, w, MIXED_RUNS + i, ollama_sampling))
            structured.append(ours_mixed(engine, w, 2 * MIXED_RUNS + i, json_schema))
    llm.close()
    for key, pair in (("decode_tps", dec), ("ttft_s", ttft), ("mixed_tps", mixed)):
        res[f"{key}_ours"], res[f"{key}_llama"] = (statistics.median(v) for v in pair)
        res[f"{key}_runs"] = pair
    res["mixed_sampled_tps_ours"], res["mixed_sampled_runs"] = statistics.median(sampled), sampled
    res["mixed_json_tps_ours"], res["mixed_json_runs"] = statistics.median(structured), structured
    res["workload"] = {"single_prompt": len(w.single), "single_tokens": n, "ttft_prompt": len(w.ttft[0]),
                       "mixed": len(w.mixed[0]), "mixed_prompts": [len(p) for p in w.mixed[0]], "mixed_outputs": w.outputs}
    llm_all = llama_cpp.Llama(str(path), n_ctx=512, logits_all=True, n_threads=threads, verbose=False)
    res["accuracy"] = accuracy(path, engine, llm_all)
    llm_all.close()
    return res


def report(res: dict) -> None:
    w, a = res["workload"], res["accuracy"]
    print(f"\nmodel {res['model']}, same GGUF on both sides; torch and llama.cpp threads {res['threads']}; "
          f"sides alternated, medians")
    print(f"  {'':10s} {'load s':>7s} {'decode tok/s':>13s} {'TTFT ms':>9s} {'mixed out tok/s':>16s}")
    for side in ("ours", "llama"):
        print(f"  {side:10s} {res[f'load_{side}_s']:7.2f} {res[f'decode_tps_{side}']:13.1f} "
              f"{res[f'ttft_s_{side}'] * 1e3:9.1f} {res[f'mixed_tps_{side}']:16.1f}")
    print(f"  per-run decode tok/s ours {_fmt(res['decode_tps_runs'][0])} llama.cpp {_fmt(res['decode_tps_runs'][1])}")
    ok = lambda good: "ok" if good else "BELOW GOAL"  # noqa: E731
    r = res["decode_tps_ours"] / res["decode_tps_llama"]
    print(f"  load, ours: {res['load_ours_s']:.2f} s (goal <= 2 s) {ok(res['load_ours_s'] <= 2)}")
    print(f"  single-stream decode ({w['single_tokens']} tok), ours / llama.cpp: {r:.2f}x (goal >= 1.0) {ok(r >= 1)}")
    r = res["mixed_tps_ours"] / res["mixed_tps_llama"]
    print(f"  mixed x{w['mixed']} output tok/s, ours (batched) / llama.cpp (one after another): {r:.2f}x "
          f"(goal >= 4) {ok(r >= 4)}")
    r = res["mixed_sampled_tps_ours"] / res["mixed_tps_ours"]
    print(f"  mixed x{w['mixed']}, ours with Ollama's default sampling / greedy: {r:.2f}x "
          f"({res['mixed_sampled_tps_ours']:.1f} vs {res['mixed_tps_ours']:.1f} tok/s; goal >= 0.85) {ok(r >= 0.85)}")
    r = res["mixed_json_tps_ours"] / res["mixed_tps_ours"]
    print(f"  mixed x{w['mixed']}, ours greedy with a JSON schema / without: {r:.2f}x "
          f"({res['mixed_json_tps_ours']:.1f} vs {res['mixed_tps_ours']:.1f} tok/s; goal >= 0.90) {ok(r >= 0.9)}")
    r = res["ttft_s_ours"] / res["ttft_s_llama"]
    print(f"  TTFT {w['ttft_prompt']}-tok prompt, ours / llama.cpp: {r:.2f}x (goal <= 1.0) {ok(r <= 1)}")
    good = a["ours_kl_mean"] < 1e-3 and a["ours_kl_max"] <= a["llama_kl_max"]
    print(f"  KL vs the exact f32 path over {a['positions']} positions: ours mean {a['ours_kl_mean']:.2e} max "
          f"{a['ours_kl_max']:.2e}; llama.cpp mean {a['llama_kl_mean']:.2e} max {a['llama_kl_max']:.2e} "
          f"(goal: ours mean < 1e-3, max <= llama.cpp's) {ok(good)}")
    good = a["ours_decode_kl_mean"] < 1e-3 and a["ours_decode_kl_max"] <= a["llama_kl_max"]
    print(f"  KL vs the exact f32 path at {a['decode_positions']} decode steps: ours mean "
          f"{a['ours_decode_kl_mean']:.2e} max {a['ours_decode_kl_max']:.2e} {ok(good)}")
    same = a["ours_answer"] == a["f32_answer"]
    print(f"  greedy 'capital of France': f32 {a['f32_answer']!r}; ours {a['ours_answer']!r} "
          f"({'same' if same else 'DIFFERENT'}); llama.cpp {a['llama_answer']!r}")


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.1f}" for v in values) + "]"
