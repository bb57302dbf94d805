"""The price of bit-identical CPU prefill (issue 28): `layers/attention.prefill_attention`'s canonical path
(every query row against a key count fixed by its position, `key_span`) vs one plain masked flash call over the
exact keys (what a prefill would cost if its numbers could depend on chunking and the prefix cache), both
sides in one run, SmolLM2-135M's attention shape (9 query heads, 3 KV heads, head dim 64), float32.

    flock /tmp/infer-heavy.lock .venv/bin/python bench/prefill_attention.py

Each case: a prompt of `total` tokens of which `total - rows` came from the prefix cache; median of
`--repeats` timed loops; ratio = canonical / plain. A model runs this once per layer per prefill chunk (30
layers for SmolLM2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from native_engine.layers.attention import prefill_attention  # noqa: E402

HEADS, KV_HEADS, DIM = 9, 3, 64
CASES = ((30, 14), (30, 30), (100, 84), (300, 284), (600, 584), (1000, 16), (2000, 2000))


def plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cached: int, scale: float) -> torch.Tensor:
    rows = torch.arange(q.shape[0])[:, None] + num_cached
    mask = torch.arange(k.shape[0])[None, :] <= rows
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


def time_us(fn, args: tuple, loops: int, repeats: int) -> float:
    for _ in range(3):
        fn(*args)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn(*args)
        runs.append((time.perf_counter() - t0) / loops * 1e6)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"{'total':>6s} {'rows':>5s} {'canonical us':>13s} {'plain us':>9s} {'ratio':>6s}")
    with torch.inference_mode():
        for total, n in CASES:
            q = torch.randn(n, HEADS, DIM, generator=gen)
            k, v = (torch.randn(total, KV_HEADS, DIM, generator=gen) for _ in range(2))
            loops = max(1, int(2e5 // (n * total + 1e4)))
            case = (q, k, v, total - n, DIM**-0.5)
            c, p = time_us(prefill_attention, case, loops, args.repeats), time_us(plain, case, loops, args.repeats)
            rows.append({"total": total, "rows": n, "canonical_us": c, "plain_us": p, "ratio": c / p})
            print(f"{total:6d} {n:5d} {c:13.1f} {p:9.1f} {c / p:6.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
