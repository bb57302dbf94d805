"""Relative accuracy: how far B's next-token distributions are from A's on A's own greedy text.

For each prompt: A generates greedily; A's tokens are teacher-forced on B (and, for an engine, on A
too, so both sides come from one forward pass over the same tokens); at each position of A's answer
we compare the two distributions:

- KL(A‖B): exact over the whole vocabulary when both targets are our engines over one vocabulary,
  else estimated from the top-k of each side plus one bucket for the rest (``divergence.kl_buckets``,
  a lower bound). With both engines the top-k estimate is computed as well, from each side's top-k
  alone as an API would return it, so the report says how far the estimate is from the exact KL;
- agreement: whether B's most likely token is A's token (llama-perplexity's "same top p");
- Δp = p_B(t) − p_A(t) for A's token t;
- the first divergence: the first position where B would have chosen another token; up to there
  B's greedy answer is A's, and its KL is the documents' number for "when greedy outputs differ".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from .divergence import kl_buckets, kl_rows, rms, share, summarize
from .target import Continuation, Dist, Piece, Target


@dataclass(slots=True)
class Position:
    index: int
    token: str  # A's token
    b_token: str | None  # B's most likely token there
    agree: bool | None
    kl: float | None  # exact where both rows are known, else the top-k estimate
    kl_topk: float | None  # the top-k estimate (equal to kl when that is the estimate)
    p_a: float | None  # probability of A's token on A, and on B
    p_b: float | None


@dataclass(slots=True)
class PromptResult:
    prompt: str
    answer: str  # A's greedy continuation
    positions: list[Position]

    @property
    def first_divergence(self) -> Position | None:
        return next((p for p in self.positions if p.agree is False), None)


@dataclass(slots=True)
class RelativeResult:
    method: str  # "exact" | "top-k"
    top_k: int
    prompts: list[PromptResult] = field(default_factory=list)

    def positions(self) -> list[Position]:
        return [p for r in self.prompts for p in r.positions]

    def summary(self) -> dict:
        positions = self.positions()
        known = [p for p in positions if p.agree is not None]
        same, same_se = share(sum(bool(p.agree) for p in known), len(known))
        dp = [p.p_b - p.p_a for p in positions if p.p_a is not None and p.p_b is not None]
        first = [r.first_divergence for r in self.prompts]
        out = {
            "positions": len(positions),
            "positions_compared": sum(p.kl is not None for p in positions),
            "kl": _stats([p.kl for p in positions]),
            "same_top": same, "same_top_stderr": same_se,
            "delta_p": {"mean": sum(dp) / len(dp) if dp else math.nan, "rms": rms(dp),
                        "max_abs": max((abs(x) for x in dp), default=math.nan)},
            "prompts": len(self.prompts),
            "prompts_diverged": sum(f is not None for f in first),
            "first_divergence": [None if f is None else {"position": f.index, "kl": f.kl, "a_token": f.token,
                                                         "b_token": f.b_token} for f in first],
        }
        if self.method == "exact":
            out["kl_topk"] = _stats([p.kl_topk for p in positions])
            out["topk_error"] = topk_error(positions)
        return out

    def as_dict(self) -> dict:
        return {"method": self.method, "top_k": self.top_k, "summary": self.summary(),
                "prompts": [{"prompt": r.prompt, "answer": r.answer,
                             "positions": [asdict(p) for p in r.positions]} for r in self.prompts]}


def _stats(values: list[float | None]) -> dict | None:
    summary = summarize([v for v in values if v is not None])
    return summary.as_dict() if summary else None


def topk_error(positions: list[Position]) -> dict:
    """How far the top-k estimate is from the exact KL (both known at every position)."""
    pairs = [(p.kl, p.kl_topk) for p in positions if p.kl is not None and p.kl_topk is not None]
    if not pairs:
        return {}
    exact_mean = sum(e for e, _ in pairs) / len(pairs)
    topk_mean = sum(t for _, t in pairs) / len(pairs)
    return {"mean_abs": sum(abs(t - e) for e, t in pairs) / len(pairs),
            "max_abs": max(abs(t - e) for e, t in pairs),
            "mean_ratio": topk_mean / exact_mean if exact_mean > 0 else math.nan}


def topk_kl(a: Dist, b: Dist) -> float | None:
    """KL over the tokens whose log-probability both sides know (the union of the two top-k, where a
    side with a full row knows every token) plus one bucket for the rest; 0 when they share no token
    (one bucket), None when a side lists none."""
    if not a.top or not b.top:
        return None
    keys = [k for k in dict.fromkeys([*a.top, *b.top]) if a.logprob(k) is not None and b.logprob(k) is not None]
    return kl_buckets([a.logprob(k) for k in keys], [b.logprob(k) for k in keys])


def is_exact(a: Dist | None, b: Dist | None) -> bool:
    return (a is not None and b is not None and a.row is not None and b.row is not None
            and a.vocab is not None and a.vocab.same_as(b.vocab))


def compare_position(index: int, piece: Piece, a: Dist | None, b: Dist | None) -> Position:
    position = Position(index, piece.text, None, None, None, None, None, None)
    if b is None:
        return position
    best, exact = b.best(), is_exact(a, b)
    position.b_token = None if best is None else best.decode("utf-8", errors="replace")
    if exact and piece.id is not None:
        position.agree = b.best_id() == piece.id
    elif best is not None:
        position.agree = best == piece.bytes
    if a is None:
        return position
    if exact:
        position.kl = float(kl_rows(a.row, b.row))
        position.kl_topk = topk_kl(a.truncated(), b.truncated())
        position.p_a, position.p_b = math.exp(a.row[piece.id]), math.exp(b.row[piece.id])
        return position
    position.kl = position.kl_topk = topk_kl(a, b)
    lp_a, lp_b = a.logprob(piece.bytes), b.logprob(piece.bytes)
    position.p_a = None if lp_a is None else math.exp(lp_a)
    position.p_b = None if lp_b is None else math.exp(lp_b)
    return position


def compare_answer(continuation: Continuation, dists_a: list[Dist | None], dists_b: list[Dist | None]) -> PromptResult:
    positions = [compare_position(i, piece, da, db)
                 for i, (piece, da, db) in enumerate(zip(continuation.pieces, dists_a, dists_b, strict=True))]
    return PromptResult(continuation.prompt, continuation.text, positions)


def compare_relative(a: Target, b: Target, prompts: list[str], *, max_tokens: int, top_k: int,
                     on_prompt: Callable[[int, int], None] | None = None) -> RelativeResult:
    """Greedy answers from A, teacher-forced on B, compared position by position."""
    answers = a.generate_greedy(prompts, max_tokens, top_k)
    results = []
    for i, answer in enumerate(answers):
        dists_a = answer.dists if answer.dists is not None else a.score(answer, top_k)
        results.append(compare_answer(answer, dists_a, b.score(answer, top_k)))
        if on_prompt:
            on_prompt(i + 1, len(answers))
    exact = a.vocab is not None and a.vocab.same_as(b.vocab)
    return RelativeResult("exact" if exact else "top-k", top_k, results)
