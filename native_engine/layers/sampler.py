"""Turns the last-position logits of each sampling sequence into next tokens.

Order (as vLLM): raw log-probabilities for reporting, penalties, then greedy rows take the
argmax; other rows divide by temperature, apply top-k, top-p and min-p, and draw from their
own `torch.Generator`, so a seeded sequence gives the same tokens whatever else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class SamplingRow:
    params: object  # SamplingParams
    generator: torch.Generator | None
    prompt_token_ids: list[int]
    output_token_ids: list[int]


@dataclass(slots=True)
class SampledToken:
    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


def apply_penalties(logits: torch.Tensor, row: SamplingRow) -> None:  # logits: [V], in place
    p = row.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(row.prompt_token_ids) | set(row.output_token_ids)), dtype=torch.long)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and row.output_token_ids:
        counts = torch.bincount(torch.tensor(row.output_token_ids), minlength=logits.shape[0])[: logits.shape[0]]
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)


def _is_greedy(p) -> bool:
    return p.temperature < 1e-5


def _has_penalty(p) -> bool:
    return p.repetition_penalty != 1.0 or bool(p.presence_penalty) or bool(p.frequency_penalty)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """logits: [V] already divided by temperature -> probabilities with the filtered tokens zeroed."""
    probs = torch.softmax(logits, dim=-1)
    if top_k > 0 and top_k < probs.shape[0]:
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs < kth, 0.0, probs)
    if min_p > 0:
        probs = torch.where(probs < min_p * probs.max(), 0.0, probs)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(0) - sorted_probs
        sorted_probs = torch.where(before > top_p * sorted_probs.sum(), 0.0, sorted_probs)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return probs


def _draw(logits: torch.Tensor, row: SamplingRow) -> int:
    p = row.params
    probs = filter_logits(logits / p.temperature, p.top_k, p.top_p, p.min_p)
    return int(torch.multinomial(probs, 1, generator=row.generator))


def _logprobs(logprobs: torch.Tensor, token_id: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    top: list[tuple[int, float]] = []
    if k:
        values, ids = logprobs.topk(k)
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return float(logprobs[token_id]), top


class Sampler:
    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> list[SampledToken]:
        # logits: [S, V] float32, one row per sampling sequence
        logits = logits.cpu()
        want_logprobs = any(r.params.logprobs is not None for r in rows)
        raw = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        if any(_has_penalty(r.params) for r in rows):
            logits = logits.clone()
        greedy = [i for i, r in enumerate(rows) if _is_greedy(r.params)]
        out: list[SampledToken] = []
        for i, row in enumerate(rows):
            if _has_penalty(row.params):
                apply_penalties(logits[i], row)
        argmax = logits.argmax(dim=-1).tolist() if greedy else []
        for i, row in enumerate(rows):
            token = argmax[i] if _is_greedy(row.params) else _draw(logits[i], row)
            sampled = SampledToken(token)
            if raw is not None and row.params.logprobs is not None:
                sampled.logprob, sampled.top_logprobs = _logprobs(raw[i], token, row.params.logprobs)
            out.append(sampled)
        return out
