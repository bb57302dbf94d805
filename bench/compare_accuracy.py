"""`infer compare`'s exactness goals, measured with the library `infer compare` runs on.

1. tiny random model, one f32 GGUF, native engine vs llama.cpp: exact KL(A‖B); goal max < 1e-6.
2. the same model as Q8_0 vs its f32 file (native vs native, and f32 native vs Q8_0 llama.cpp): goal
   1e-6 < mean KL < 1e-1, and the argmax agreement (the random model's distributions are nearly flat,
   so Q8_0's ~1e-3 logit noise flips near-ties: agreement high but under 100 %).
3. (--smollm2) SmolLM2-135M Q4_1 on the native engine's default path vs its exact f32 path
   (dequantized weights, `cpu_int4_matmul=false`): goal the figure of bench/native_smollm2.py's
   accuracy part (mean KL ~4e-7 on its 90-token chat text), here on A's greedy answers to the
   built-in prompts and to that chat prompt.
4. the top-k estimate (each side's top-k plus one tail bucket, as from an API) against the exact
   KL of each pair above, for several k.

Each pair loads both sides once in this process; the figures are deterministic (greedy, no timing).
    python bench/compare_accuracy.py [--smollm2] [--max-tokens 64] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accuracy import compare_relative, open_target  # noqa: E402
from accuracy.prompts import load_prompts  # noqa: E402
from registry.modelbuilder import PRESETS, build_gguf  # noqa: E402

CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
EXACT_F32 = "?dtype=float32&cpu_int4_matmul=false"


def measure(name: str, a_spec: str, b_spec: str, prompts: list[str], max_tokens: int, ks: tuple[int, ...]) -> dict:
    a, b = open_target(a_spec), open_target(b_spec)
    try:
        runs = {k: compare_relative(a, b, prompts, max_tokens=max_tokens, top_k=k).summary() for k in ks}
    finally:
        a.close()
        b.close()
    main = runs[20 if 20 in runs else ks[0]]
    return {"name": name, "a": a_spec, "b": b_spec, "positions": main["positions"], "kl_mean": main["kl"]["mean"],
            "kl_max": main["kl"]["max"], "same_top": main["same_top"],
            "prompts_diverged": main["prompts_diverged"],
            "topk_ratio": {k: r["topk_error"].get("mean_ratio") for k, r in runs.items()}}


def report(rows: list[dict], goals: dict[str, tuple[str, bool]]) -> None:
    print(f"{'pair':34} {'tokens':>6} {'mean KL':>10} {'max KL':>10} {'same top':>9}  top-k mean / exact mean")
    for r in rows:
        ratios = ", ".join(f"k={k}: {v:.3g}" for k, v in r["topk_ratio"].items())
        print(f"{r['name']:34} {r['positions']:>6} {r['kl_mean']:>10.3g} {r['kl_max']:>10.3g} "
              f"{100 * r['same_top']:>8.2f}%  {ratios}")
    print()
    for name, (text, ok) in goals.items():
        print(f"  {name}: {text} {'OK' if ok else 'MISSED'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M Q4_1 (a minute or two of CPU)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    prompts, ks = load_prompts(), (5, 20, 100)
    tmp = Path(tempfile.mkdtemp(prefix="compare-accuracy-"))
    f32 = build_gguf(tmp / "tiny-f32.gguf", PRESETS["tiny-qwen2"], dtype="f32", seed=0)
    q8 = build_gguf(tmp / "tiny-q8_0.gguf", PRESETS["tiny-qwen2"], dtype="q8_0", seed=0)
    rows = [measure("tiny f32: native vs llama.cpp", f"{f32}@native", f"{f32}@llamacpp", prompts, args.max_tokens, ks),
            measure("tiny: f32 vs Q8_0, both native", f"{f32}@native", f"{q8}@native", prompts, args.max_tokens, ks),
            measure("tiny: f32 native vs Q8_0 llama.cpp", f"{f32}@native", f"{q8}@llamacpp", prompts,
                    args.max_tokens, ks)]
    goals = {"tiny f32 native vs llama.cpp": (f"max KL {rows[0]['kl_max']:.3g} < 1e-6", rows[0]["kl_max"] < 1e-6)}
    for r in rows[1:]:
        goals[r["name"]] = (f"1e-6 < mean KL {r['kl_mean']:.3g} < 1e-1, same top {100 * r['same_top']:.2f} %",
                            1e-6 < r["kl_mean"] < 1e-1 and 0.85 <= r["same_top"] < 1.0)
    if args.smollm2:
        from registry.realmodels import fetch_smollm2

        smol = fetch_smollm2()
        for name, plist in (("SmolLM2 Q4_1: f32 path vs default", prompts), ("  the same, on the chat prompt", [CHAT])):
            rows.append(measure(name, f"{smol}@native{EXACT_F32}", f"{smol}@native", plist, args.max_tokens, (5, 20)))
        goals["SmolLM2 Q4_1 vs f32 path"] = (
            f"mean KL {rows[-2]['kl_mean']:.3g} (built-in prompts), {rows[-1]['kl_mean']:.3g} (chat prompt); "
            "bench/native_smollm2.py: ~4e-7", max(rows[-2]["kl_mean"], rows[-1]["kl_mean"]) < 1e-6)
    report(rows, goals)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "goals": {k: v[1] for k, v in goals.items()}}, indent=2))
    return 0 if all(ok for _, ok in goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
