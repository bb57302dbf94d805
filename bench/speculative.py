"""Speculative decoding on CPU: SmolLM2-135M-Instruct Q4_1, the same engine with and without it.

Both engines are loaded once in one process and measured alternately (plain, speculative, plain, ...), so
a busy neighbour slows both; figures are medians over ``--runs``; the machine's load is printed.

1. input-grounded, batch 1: edit a given ~400-token text (fix its spelling mistakes), greedy, 256 tokens
   at most. Decode tok/s = (n - 1) / (last - first token time). Goal: n-gram / plain >= 1.6.
   The same for a summary of another given text (reported, no goal: a summary copies less).
2. open-ended story, batch 1: goal n-gram / plain >= 0.95 (the adaptive off-switch).
3. 16 concurrent requests (8 edits of different texts, 8 stories), output tok/s over the wall time of the
   batch. Goal: n-gram / plain >= 0.95.
4. draft model: SmolLM2 as its own draft (acceptance must be 100 % and the tokens equal: the mechanism),
   k = 4, adaptive off, on the edit task; its speed is the overhead bound (the draft costs what the target
   costs). No smaller model of SmolLM2's vocabulary is available offline; the cheapest draft there is,
   SmolLM2's own first 20 of 30 layers (`layers=20`, self-speculation without LayerSkip's training), is
   measured too (adaptive off, so its acceptance shows).
Every speculative run's greedy tokens are checked equal to the plain run's.

    python bench/speculative.py [--runs 3] [--json .bench/speculative/results.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.noise import cpu_ticks, others_cores  # noqa: E402
from native_engine import LLMEngine, SamplingParams  # noqa: E402
from registry.realmodels import fetch_smollm2  # noqa: E402

EDIT_TEXT = """The old harbour town of Westmere sits at the mouth of a wide, slow river. For most of its history the \
town lived from fishing and from the small boatyards along the eastern quay, where wooden hulls were built by \
hand untill the nineteen-sixties. Today only one yard is left, and it repairs more yachts than it builds \
fishing boats. The market square, with its clock tower and its row of narrow houses painted in blue, yellow \
and green, is the first thing visitors see when they arive by ferry.

Every saturday morning the square fills with stalls. Farmers from the valley sell cheese, apples and honey; \
a baker brings rye bread and cinammon buns; and an old man who calls himself the last net-maker of Westmere \
shows children how to tie the knots his grandfather taught him. In summer the town hosts a music festival on \
the beach, and in winter the storms close the ferry for days at a time, so the people who live here all year \
keep full cupboards and good neighbours.

The river is also the reason the town exists at all. Ships could sail up it as far as the old stone bridge, \
and goods from the inland farms were loaded here for the cities on the coast. When the railway came in 1871 \
the trade moved away, and the harbour became quiet. The warehouses on the west bank were turned into flats, a \
library and a small museum, which tells the story of the river trade with models of the ships, old maps and \
the ledgers of the harbour master.

Visitors who want to walk can follow the river path north for six kilometers to the ruins of a watermill, or \
take the cliff path south, where seabirds nest in the spring and seals sometimes rest on the rocks below. \
Both paths are steep in places and can be muddy after rain, so good shoes are recomended."""

SUMMARY_TEXT = (Path(__file__).resolve().parents[1] / "registry" / "modelbuilder" / "data" / "corpus.txt"
                ).read_text()[:2000]


def chat(user: str) -> str:
    return (f"<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


EDIT = chat(f"Correct the spelling mistakes in the following text. Reply with the corrected text only.\n\n{EDIT_TEXT}")
SUMMARY = chat(f"Summarise the following text in a few sentences.\n\n{SUMMARY_TEXT}")
STORIES = [chat(f"Write a short story about {topic}.") for topic in (
    "a dragon who is afraid of the dark", "a robot that learns to bake bread", "two friends lost in a forest",
    "a cat who becomes the mayor of a small town", "a girl who finds a map in her attic",
    "an astronaut who misses her dog", "a wizard who forgot his spells", "a lighthouse keeper and a storm")]
PARAGRAPHS = EDIT_TEXT.split("\n\n")
EDITS = [chat("Correct the spelling mistakes in the following text. Reply with the corrected text only.\n\n"
              + "\n\n".join(PARAGRAPHS[i:] + PARAGRAPHS[:i])) for i in range(4)] * 2  # 4 texts, the paragraphs rotated
ENGINE = dict(max_num_seqs=64, max_model_len=2048, max_num_batched_tokens=512)  # infer serve's defaults


def decode_rate(engine: LLMEngine, prompt: str, max_tokens: int) -> tuple[float, list[int]]:
    out = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens))[0]
    m, n = out.metrics, len(out.outputs[0].token_ids)
    return (n - 1) / (m.last_token_time - m.first_token_time), out.outputs[0].token_ids


def batch_rate(engine: LLMEngine, prompts: list[str], max_tokens: int) -> tuple[float, list[list[int]]]:
    t = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens))
    tokens = [o.outputs[0].token_ids for o in outs]
    return sum(map(len, tokens)) / (time.perf_counter() - t), tokens


def alternate(plain: LLMEngine, spec: LLMEngine, runs: int, measure) -> dict:
    """measure(engine) -> (rate, tokens); plain and speculative alternate; medians and the ratio."""
    rates: dict[str, list[float]] = {"plain": [], "spec": []}
    before, started, equal = cpu_ticks(), time.perf_counter(), True
    stats0 = dict(spec.spec_decode_stats() or {})
    for _ in range(runs):
        p_rate, p_tokens = measure(plain)
        s_rate, s_tokens = measure(spec)
        rates["plain"].append(p_rate)
        rates["spec"].append(s_rate)
        equal &= p_tokens == s_tokens
    stats = spec.spec_decode_stats() or {}
    drafts = stats.get("num_draft_tokens", 0) - stats0.get("num_draft_tokens", 0)
    accepted = stats.get("num_accepted_tokens", 0) - stats0.get("num_accepted_tokens", 0)
    verifies = stats.get("num_drafts", 0) - stats0.get("num_drafts", 0)
    plain_rate, spec_rate = statistics.median(rates["plain"]), statistics.median(rates["spec"])
    return {"plain_tok_s": plain_rate, "spec_tok_s": spec_rate, "ratio": spec_rate / plain_rate,
            "greedy_equal": equal, "draft_tokens": drafts, "accepted_tokens": accepted, "verify_steps": verifies,
            "acceptance_rate": accepted / drafts if drafts else None,
            "mean_accepted_length": 1 + accepted / verifies if verifies else None,
            "others_cores": others_cores(before, cpu_ticks(), time.perf_counter() - started),
            "runs": rates}


def report(name: str, result: dict, goal: float | None) -> None:
    acc = result["acceptance_rate"]
    verdict = "" if goal is None else ("  goal >= %.2f: %s" % (goal, "met" if result["ratio"] >= goal else "MISSED"))
    print(f"{name:<34} plain {result['plain_tok_s']:7.1f} tok/s  speculative {result['spec_tok_s']:7.1f} tok/s  "
          f"x{result['ratio']:.2f}  acceptance {'-' if acc is None else f'{acc:.0%}'}  "
          f"mean length {result['mean_accepted_length'] or 0:.2f}  equal {result['greedy_equal']}  "
          f"(others {result['others_cores']:.2f} cores){verdict}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--spec", default="ngram:k=4", help="the speculative side's method (default ngram:k=4)")
    ap.add_argument("--quick", action="store_true", help="fewer tokens (a smoke run)")
    ap.add_argument("--no-draft", action="store_true", help="skip the draft-model pass")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    n = 64 if args.quick else 256
    model = str(fetch_smollm2())
    plain = LLMEngine.from_model(model, **ENGINE)
    spec = LLMEngine.from_model(model, speculative=args.spec, **ENGINE)
    mixed = [p for pair in zip(EDITS, STORIES, strict=True) for p in pair]
    for engine in (plain, spec):  # warm-up: kernels built, first-call costs paid, at batch 1 and 16
        engine.generate([EDIT], SamplingParams(temperature=0, max_tokens=8))
        engine.generate(mixed, SamplingParams(temperature=0, max_tokens=8))
    results = {"model": model, "spec": args.spec, "max_tokens": n}
    print(f"SmolLM2-135M Q4_1 on CPU ({plain.model_runner.dtype}), {args.spec} vs plain, medians of {args.runs} runs")
    results["edit"] = alternate(plain, spec, args.runs, lambda e: decode_rate(e, EDIT, n))
    report("edit (batch 1)", results["edit"], 1.6)
    results["summary"] = alternate(plain, spec, args.runs, lambda e: decode_rate(e, SUMMARY, n))
    report("summary (batch 1)", results["summary"], None)
    results["story"] = alternate(plain, spec, args.runs, lambda e: decode_rate(e, STORIES[0], n))
    report("story (batch 1)", results["story"], 0.95)
    results["concurrent16"] = alternate(plain, spec, args.runs, lambda e: batch_rate(e, mixed, n))
    report("16 concurrent (8 edit, 8 story)", results["concurrent16"], 0.95)
    if not args.no_draft:
        del spec
        draft = LLMEngine.from_model(model, speculative=f"draft:{model}:k=4,adaptive=off", **ENGINE)
        results["draft_self"] = alternate(plain, draft, max(1, args.runs - 1), lambda e: decode_rate(e, EDIT, n))
        report("draft = itself, k=4 (edit)", results["draft_self"], None)
        del draft
        layers = LLMEngine.from_model(model, speculative=f"draft:{model}:k=3,layers=20,adaptive=off", **ENGINE)
        results["draft_layers20"] = alternate(plain, layers, 1, lambda e: decode_rate(e, EDIT, n // 2))
        report("draft = its first 20 layers, k=3", results["draft_layers20"], None)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
