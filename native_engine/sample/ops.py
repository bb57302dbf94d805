"""The sampler's tensor maths: the same few torch ops on CPU and GPU, no host sync, no loop over rows
(except `exponential_noise` over the seeded rows, which each own a generator).

Shapes: S sampled rows, V vocabulary, K candidates kept by top-k (K = V when no row filters by top-k).
"""

from __future__ import annotations

import numpy as np
import torch

from ..kernels.sampling import fused_sampling, penalties_triton

_TINY = 1e-10  # exponential noise floor: a zero would make p / q infinite (nano-vllm's clamp)


def apply_penalties(logits: torch.Tensor, seen: torch.Tensor | None, counts: torch.Tensor | None,
                    repetition: torch.Tensor | None, presence: torch.Tensor | None,
                    frequency: torch.Tensor | None) -> torch.Tensor:
    """vLLM's semantics. logits [S, V] float32; seen [S, V] bool (prompt and output tokens); counts [S, V]
    int32 (output tokens); repetition/presence/frequency [S] float32 (None: no row uses it).
    Repetition divides positive and multiplies negative logits of seen tokens; frequency subtracts
    count * f, presence subtracts p once per token that appeared in the output.

    On a GPU, dense ops over [S, V] (a few microseconds); on CPU the same maths on the seen tokens only
    (a few hundred per row), in place: the dense form costs milliseconds a step there."""
    if seen is None:
        return logits
    if logits.device.type == "cpu":
        fn = penalties_at_seen
    else:  # one Triton kernel for the dense ops (kernels/sampling.py) where it runs
        fn = penalties_triton if fused_sampling(logits) else penalties_dense
    return fn(logits, seen, counts, repetition, presence, frequency)


def penalties_dense(logits, seen, counts, repetition, presence, frequency) -> torch.Tensor:
    if repetition is not None:
        r = repetition[:, None]
        logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    if frequency is not None:
        logits = logits - frequency[:, None] * counts - presence[:, None] * (counts > 0)
    return logits


def penalties_at_seen(logits, seen, counts, repetition, presence, frequency) -> torch.Tensor:
    rows, cols = seen.nonzero(as_tuple=True)
    values = logits[rows, cols]
    if repetition is not None:
        r = repetition[rows]
        values = torch.where(values > 0, values / r, values * r)
    if frequency is not None:
        c = counts[rows, cols]
        values = values - frequency[rows] * c - presence[rows] * (c > 0)
    logits[rows, cols] = values
    return logits


def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor | None, bitmask: torch.Tensor) -> None:
    """Grammar masks, in place: logits [S, V]; rows [G] int64, the rows with a grammar (None: every row);
    bitmask [G, ceil(V / 32)] int32, bit t % 32 of word t // 32 set = token t allowed (llguidance's layout)."""
    assert bitmask.dtype == torch.int32 and bitmask.dim() == 2, (bitmask.dtype, bitmask.shape)
    assert bitmask.shape[0] == (logits.shape[0] if rows is None else rows.shape[0]), (bitmask.shape, logits.shape)
    assert bitmask.shape[1] * 32 >= logits.shape[1], (bitmask.shape, logits.shape)
    banned = _banned(bitmask, logits.shape[1])
    if rows is None:
        logits.masked_fill_(banned, float("-inf"))
    else:
        logits[rows] = logits.index_select(0, rows).masked_fill_(banned, float("-inf"))


def _banned(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[G, V] bool, True where the bit is clear. On CPU numpy's unpackbits (~25x the torch ops there)."""
    return banned_numpy(bitmask, vocab) if bitmask.device.type == "cpu" else banned_torch(bitmask, vocab)


def banned_numpy(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    bits = np.unpackbits(np.invert(bitmask.numpy()).view(np.uint8), axis=1, bitorder="little")
    return torch.from_numpy(np.ascontiguousarray(bits[:, :vocab])).view(torch.bool)


def banned_torch(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    return (((bitmask[:, :, None] >> shifts) & 1) == 0).flatten(1)[:, :vocab]


def top_k_top_p(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None, k: int,
                top_p: torch.Tensor | None, min_p: torch.Tensor | None, greedy: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [S, V], temperature [S] -> (probs [S, K], ids [S, K] or None = identity).

    The candidates are chosen on the raw logits (a positive temperature keeps each row's order) and only
    they are divided by the temperature. Top-k first (one `topk` of the largest k in the batch, each row then cut at its own k), then the
    softmax over what is left, top-p on the sorted probabilities (a token stays while the mass before it
    is <= p), min-p against the row's largest probability. Zeroed probabilities are never drawn."""
    vocab, mass = logits.shape[1], None
    if k < vocab:
        values, ids = logits.topk(k, dim=-1)  # sorted, largest first
    elif top_p is not None or top_k is not None:  # some row keeps the whole vocabulary, another cuts it
        values, ids, mass = _sorted_candidates(logits, temperature, top_k, top_p, greedy)
    else:
        values, ids = logits, None
    values = values / temperature[:, None]
    if top_k is not None:
        cut = torch.arange(values.shape[1], device=values.device)[None, :] >= top_k[:, None]
        values = values.masked_fill(cut, float("-inf"))
    probs = values.softmax(dim=-1)
    if top_p is not None:
        before = probs.cumsum(dim=-1) - probs
        if mass is not None:  # candidates short of the vocabulary: the mass before a token, of the whole row
            before = before * mass[:, None]
        probs = probs.masked_fill(before > top_p[:, None], 0.0)
    if min_p is not None:
        probs = probs.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), 0.0)
    return probs, ids


_NUCLEUS = 256  # CPU: candidates tried for rows with top-p and no top-k before sorting the whole vocabulary


def _sorted_candidates(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                       top_p: torch.Tensor | None, greedy: torch.Tensor | None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Candidates, sorted, for a batch where some random row keeps the whole vocabulary. On a GPU (and
    when it must) a sort of every row. On CPU, where that sort costs tens of milliseconds, the top
    `_NUCLEUS` first: exact when every random row either cuts at a top-k within them or has its top-p
    nucleus inside them (their probability mass, of the whole row, above p), which the host checks
    (free on CPU); then the row's mass (1 for top-k rows) scales its top-p test. Else the sort."""
    vocab = logits.shape[1]
    if logits.device.type == "cpu" and top_p is not None and vocab > _NUCLEUS:
        values, ids = logits.topk(_NUCLEUS, dim=-1)
        t = temperature[:, None]
        mass = (values / t - torch.logsumexp(logits / t, dim=-1, keepdim=True)).exp().sum(dim=-1)
        cut = top_k < vocab if top_k is not None else torch.zeros_like(mass, dtype=torch.bool)
        fine = torch.where(cut, top_k <= _NUCLEUS if top_k is not None else cut, mass > top_p)
        if greedy is not None:
            fine |= greedy
        if bool(fine.all()):
            return values, ids, torch.where(cut, torch.ones_like(mass), mass)
    values, ids = logits.sort(dim=-1, descending=True)
    return values, ids, None


def exponential_noise(probs: torch.Tensor, ids: torch.Tensor | None, vocab: int, generator: torch.Generator | None,
                      seeded: list[tuple[int, torch.Generator]], clamp: bool = True) -> torch.Tensor:
    """Exp(1) noise [S, K]: one batched draw, then each seeded row redrawn from its own generator over the
    whole vocabulary in token order and gathered at its candidates, so its tokens depend on nothing else in
    the batch (not even on how many candidates the batch keeps). `clamp=False`: the caller clamps."""
    q = torch.empty_like(probs).exponential_(generator=generator)
    for row, gen in seeded:
        full = torch.empty(vocab, device=probs.device, dtype=probs.dtype).exponential_(generator=gen)
        q[row] = full if ids is None else full.index_select(0, ids[row])
    return q.clamp_min_(_TINY) if clamp else q


def exponential_race(probs: torch.Tensor, ids: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """argmax(p / q) with q ~ Exp(1) draws token t with probability p_t / sum(p) (the Gumbel-max trick in
    another form): one batched categorical draw, no cumulative sums, no host sync. -> [S] int64 ids."""
    choice = probs.div(q).argmax(dim=-1)
    return choice if ids is None else ids.gather(1, choice[:, None]).squeeze(1)


def full_probs(probs: torch.Tensor, ids: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """The candidates' probabilities scattered back to [S, V], normalised (for rejection sampling)."""
    probs = probs / probs.sum(dim=-1, keepdim=True)
    if ids is None:
        return probs
    return torch.zeros(probs.shape[0], vocab, device=probs.device, dtype=probs.dtype).scatter_(1, ids, probs)


def gather_logprobs(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """The model's log-probabilities (raw logits, before penalties and temperature, as vLLM reports):
    logits [L, V], tokens [L] -> [L, 1 + 2k] float64: the sampled token's logprob, then k top ids and k
    top logprobs; float64 holds the ids exactly, so the whole result crosses to the host in one copy."""
    logprobs = logits.log_softmax(dim=-1)
    sampled = logprobs.gather(1, tokens[:, None])
    top_values, top_ids = logprobs.topk(k, dim=-1) if k else (sampled[:, :0], tokens[:, None][:, :0])
    return torch.cat([sampled.double(), top_ids.double(), top_values.double()], dim=1)
