"""Verification of draft tokens against the target model (Leviathan et al. 2023; Chen et al. 2023), the
shape of vLLM v1's `RejectionSampler`.

A verify row of k drafts has k + 1 target distributions p_0..p_k (the sampler's processed distribution:
temperature, top-k, top-p, min-p; one-hot for greedy rows), laid out as k + 1 consecutive rows. Draft j is
accepted with probability min(1, p_j(x_j) / q_j(x_j)); at the first rejection the row ends with a token
drawn from norm(max(0, p_j - q_j)); when all k are accepted a bonus token is drawn from p_k. The output is
then distributed exactly as the target's own samples (tests/native_engine/test_rejection_sampler.py
checks it with a chi-square test). For n-gram drafts q_j is a point mass at x_j: accept with probability
p_j(x_j), else draw from p_j without x_j. Greedy rows accept while the target's argmax equals the draft.

Everything of size [rows, V] stays on the device; the host gets one small tensor: each draft's accept
flag and each position's fallback token. An all-greedy batch is one argmax over the rows."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sample import Sampler, SamplingMetadata
from ..sample import ops


@dataclass(slots=True)
class VerifyRows:
    """Host-side layout: row i's drafts are `draft_token_ids[i]`; its k_i + 1 target positions start at
    `starts[i]` in the logits."""

    draft_token_ids: list[list[int]]
    starts: list[int]

    @classmethod
    def build(cls, draft_token_ids: list[list[int]]) -> VerifyRows:
        starts, at = [], 0
        for drafts in draft_token_ids:
            starts.append(at)
            at += len(drafts) + 1
        return cls(draft_token_ids, starts)

    @property
    def num_positions(self) -> int:
        return self.starts[-1] + len(self.draft_token_ids[-1]) + 1 if self.starts else 0

    def draft_positions(self) -> list[int]:
        return [s + j for s, d in zip(self.starts, self.draft_token_ids, strict=True) for j in range(len(d))]

    def flat_drafts(self) -> list[int]:
        return [t for d in self.draft_token_ids for t in d]


class RejectionSampler:
    def __init__(self, sampler: Sampler | None = None) -> None:
        self.sampler = sampler or Sampler()

    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata, rows: VerifyRows,
                 draft_probs: torch.Tensor | None = None, generator: torch.Generator | None = None
                 ) -> list[list[int]]:
        """logits [P, V] at every verify position (meta: one row per position); draft_probs [D, V] for a
        draft model's drafts (None: n-gram point masses) -> each row's output tokens (1..k_i + 1)."""
        assert logits.shape[0] == rows.num_positions == meta.num_rows, (logits.shape, rows.num_positions)
        if meta.all_greedy and meta.seen is None and meta.grammar_bitmask is None:
            return _greedy(logits, rows)
        probs = self.sampler.probs(logits, meta)
        positions = torch.tensor(rows.draft_positions(), dtype=torch.long, device=logits.device)
        drafts = torch.tensor(rows.flat_drafts(), dtype=torch.long, device=logits.device)
        accept = _accept(probs, positions, drafts, draft_probs, generator)
        fallback = _fallback(probs, positions, drafts, draft_probs, generator)
        host = torch.cat([accept.long(), fallback]).tolist()  # the one device-to-host copy
        return _outputs(rows, host[: len(drafts)], host[len(drafts) :])


def _greedy(logits: torch.Tensor, rows: VerifyRows) -> list[list[int]]:
    best = logits.argmax(dim=-1).tolist()
    out = []
    for start, drafts in zip(rows.starts, rows.draft_token_ids, strict=True):
        a = 0
        while a < len(drafts) and best[start + a] == drafts[a]:
            a += 1
        out.append(drafts[:a] + [best[start + a]])
    return out


def _accept(probs: torch.Tensor, positions: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
            generator: torch.Generator | None) -> torch.Tensor:
    """[D] bool: u * q(x) <= p(x) with u uniform in (0, 1] (never accepts a token the target excludes)."""
    p = probs[positions, drafts]
    q = torch.ones_like(p) if draft_probs is None else draft_probs.gather(1, drafts[:, None]).squeeze(1)
    u = 1.0 - torch.rand(p.shape, device=p.device, generator=generator)
    return u * q <= p


def _fallback(probs: torch.Tensor, positions: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
              generator: torch.Generator | None) -> torch.Tensor:
    """[P] int64: at each draft position a draw from norm(max(0, p - q)), at each last position from p."""
    residual = probs.clone()
    if draft_probs is None:
        residual[positions, drafts] = 0.0
    else:
        residual[positions] = (probs.index_select(0, positions) - draft_probs).clamp_min_(0.0)
    q = ops.exponential_noise(residual, None, residual.shape[1], generator, [])
    return ops.exponential_race(residual, None, q)


def _outputs(rows: VerifyRows, accepted: list[int], fallback: list[int]) -> list[list[int]]:
    out, d = [], 0
    for start, drafts in zip(rows.starts, rows.draft_token_ids, strict=True):
        a = 0
        while a < len(drafts) and accepted[d + a]:
            a += 1
        out.append(drafts[:a] + [fallback[start + a]])
        d += len(drafts)
    return out
