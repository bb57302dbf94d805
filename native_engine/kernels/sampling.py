"""The sampler's two element-wise stretches as one kernel each (CUDA), with the torch ops they replace as
references (`native_engine.sample.ops`; the candidates kernel's reference, built from those ops, is in its test):

- `penalties`: repetition (seen tokens: positive logits divided, negative multiplied), frequency and presence
  (output counts) over [S, V] in place: five or six launches of `penalties_dense` in one.
- `sample_candidates`: after a top-k (candidates sorted largest first, K of them), per row: temperature, the
  row's own top-k cut, softmax, top-p on the running mass, min-p against the largest probability, then the
  exponential race argmax(p / q) over the given Exp(1) noise q: the dozen launches of `ops.top_k_top_p` and
  `ops.exponential_race` on [S, K] in one program per row.
"""

import torch

from native_engine.kernels._triton import tl, triton, use_triton

_TINY = 1e-10  # the noise floor of ops.exponential_noise
MAX_CANDIDATES = 1024  # one program holds a row's candidates


@triton.jit
def _penalties_kernel(
    logits_ptr, seen_ptr, counts_ptr, rep_ptr, pres_ptr, freq_ptr, vocab,
    logits_stride, seen_stride, counts_stride, rep_stride, pres_stride, freq_stride,
    HAS_REP: tl.constexpr, HAS_COUNTS: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < vocab
    x = tl.load(logits_ptr + row * logits_stride + cols, mask=mask, other=0.0)
    if HAS_REP:
        seen = tl.load(seen_ptr + row * seen_stride + cols, mask=mask, other=0) != 0
        r = tl.load(rep_ptr + row * rep_stride)
        x = tl.where(seen, tl.where(x > 0, x / r, x * r), x)
    if HAS_COUNTS:
        c = tl.load(counts_ptr + row * counts_stride + cols, mask=mask, other=0)
        f = tl.load(freq_ptr + row * freq_stride)
        p = tl.load(pres_ptr + row * pres_stride)
        x = x - f * c.to(tl.float32) - p * (c > 0).to(tl.float32)
    tl.store(logits_ptr + row * logits_stride + cols, x, mask=mask)


def penalties_triton(logits: torch.Tensor, seen: torch.Tensor | None, counts: torch.Tensor | None,
                     repetition: torch.Tensor | None, presence: torch.Tensor | None,
                     frequency: torch.Tensor | None) -> torch.Tensor:
    """`ops.penalties_dense` in place: logits [S, V] float32; seen [S, V] bool; counts [S, V] int32."""
    rows, vocab = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1, (logits.dtype, logits.stride())
    has_counts = frequency is not None
    assert seen is not None and seen.shape == logits.shape and seen.stride(1) == 1 and seen.dtype == torch.bool
    assert not has_counts or (counts.shape == logits.shape and counts.stride(1) == 1 and presence is not None)
    if rows == 0:
        return logits
    dummy = logits
    rep, pres, freq = repetition if repetition is not None else dummy, presence if has_counts else dummy, \
        frequency if has_counts else dummy
    block = 2048
    _penalties_kernel[(rows, triton.cdiv(vocab, block))](
        logits, seen, counts if has_counts else seen, rep, pres, freq, vocab,
        logits.stride(0), seen.stride(0), counts.stride(0) if has_counts else 0, rep.stride(0),
        pres.stride(0), freq.stride(0),
        HAS_REP=repetition is not None, HAS_COUNTS=has_counts, BLOCK=block,
    )
    return logits


@triton.jit
def _candidates_kernel(
    values_ptr, ids_ptr, q_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, out_ptr, num_candidates,
    values_stride, ids_stride, q_stride, temp_stride, top_k_stride, top_p_stride, min_p_stride, tiny,
    HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr, HAS_MIN_P: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    valid = cols < num_candidates
    x = tl.load(values_ptr + row * values_stride + cols, mask=valid, other=float("-inf"))
    x = x / tl.load(temp_ptr + row * temp_stride)
    if HAS_TOP_K:
        x = tl.where(cols < tl.load(top_k_ptr + row * top_k_stride), x, float("-inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    p = e / tl.sum(e, axis=0)
    if HAS_TOP_P:
        before = tl.cumsum(p, axis=0) - p  # the mass of the candidates before this one
        p = tl.where(before > tl.load(top_p_ptr + row * top_p_stride), 0.0, p)
    if HAS_MIN_P:
        p = tl.where(p < tl.load(min_p_ptr + row * min_p_stride) * tl.max(p, axis=0), 0.0, p)
    q = tl.maximum(tl.load(q_ptr + row * q_stride + cols, mask=valid, other=1.0), tiny)
    score = tl.where(valid, p / q, -1.0)
    best = tl.argmax(score, axis=0)
    tl.store(out_ptr + row, tl.load(ids_ptr + row * ids_stride + best))


def sample_candidates_triton(values: torch.Tensor, ids: torch.Tensor, q: torch.Tensor, temperature: torch.Tensor,
                             top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                             min_p: torch.Tensor | None) -> torch.Tensor:
    """values [S, K] float32 sorted largest first, ids [S, K] int64, q [S, K] Exp(1) noise; per-row
    parameters [S] (any stride) -> the drawn ids [S] int64."""
    rows, k = values.shape
    assert values.dtype == q.dtype == torch.float32 and ids.dtype == torch.int64 and ids.shape == q.shape == values.shape
    assert values.stride(1) == ids.stride(1) == q.stride(1) == 1 and 0 < k <= MAX_CANDIDATES, (values.stride(), k)
    out = torch.empty(rows, dtype=torch.int64, device=values.device)
    if rows == 0:
        return out
    dummy = temperature
    params = [t if t is not None else dummy for t in (top_k, top_p, min_p)]
    _candidates_kernel[(rows,)](
        values, ids, q, temperature, *params, out, k,
        values.stride(0), ids.stride(0), q.stride(0), temperature.stride(0), *(t.stride(0) for t in params), _TINY,
        HAS_TOP_K=top_k is not None, HAS_TOP_P=top_p is not None, HAS_MIN_P=min_p is not None,
        BLOCK_K=max(16, triton.next_power_of_2(k)),
    )
    return out


def fused_sampling(logits: torch.Tensor) -> bool:
    """Whether the fused kernels serve these logits (CUDA with Triton)."""
    return use_triton(logits)
