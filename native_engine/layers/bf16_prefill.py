"""Prefill rows in bfloat16 on CPUs with bf16 matrix units (AMX or AVX512-BF16), f32 everywhere else.

`EngineConfig.cpu_bf16_prefill`: on a float32 CPU engine, every `Linear` of the decoder layers keeps a
dense bf16 copy of its weight (dequantized once from its Q4_1/Q8_0 blocks) and the prefill rows of a step
multiply with it through PyTorch's GEMM (oneDNN, which runs AMX tiles where the CPU has them); their
attention runs PyTorch's flash kernel on bf16 q/k/v. Activations enter and leave each matmul as float32:
the residual stream, norms, rotary embedding, SiLU and the KV cache stay float32. Decode rows (the C
decode step, or the first `ctx.num_decode_tokens` rows of a mixed step) never see bf16.

Same input, same output, as the f32 path promises (`layers/attention.py`): a token's numbers must not
depend on how its prompt was chunked, nor on the prefix cache (disaggregation recomputes a prompt's tail
on the decode worker). oneDNN rounds a row differently with the row count (PyTorch 2.13 on Sapphire
Rapids: rows of a product of 1-32 or 709+ rows agree, 33-708 do not), so `bf16_linear` multiplies up to
`PIECE_ROWS` rows, or `WHOLE_ROWS` and more, in one call and anything between in pieces of `PIECE_ROWS`.
The attention keeps the f32 path's canonical blocking (`_canonical_flash_attention`), in bf16.

A fast path that cannot prove itself steps aside: `usable(k, n)` is decided at load for each weight
shape, on random rows, and needs the CPU's flags (`/proc/cpuinfo`: amx_bf16 or avx512_bf16), a
normalized squared error against the float64 product within `NMSE_LIMIT` (bf16 inputs: ~1e-5; a broken
kernel ~1), and rows that come out the same alone, in pieces and in a whole product; `attention_usable`
runs the bf16 attention once against the f32 one (under ATEN_CPU_CAPABILITY=avx2 or default oneDNN still
multiplies on AMX, but PyTorch's bf16 flash kernel raises: the path steps aside there). The cost: a bf16
copy of every layer weight (2 bytes a weight: 212 MB for SmolLM2-135M, ~13 GB for a 7B model).
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from ..kernels import cpu_kernels
from .attention import _canonical_flash_attention, bf16_canonical_attention
from .kernel_check import nmse

PIECE_ROWS, WHOLE_ROWS = 32, 1024
NMSE_LIMIT = 1e-4
CPU_FLAGS = ("amx_bf16", "avx512_bf16")
log = logging.getLogger(__name__)


def bf16_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, K] float32 @ weight [N, K] bf16 -> [T, N] float32; a row's numbers do not depend on T."""
    out = bf16_matmul(x.to(torch.bfloat16), weight).float()
    return out if bias is None else out.add_(bias)


def bf16_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [T, K] @ [N, K].T -> [T, N], all bf16
    rows = x.shape[0]
    if rows <= PIECE_ROWS or rows >= WHOLE_ROWS:
        return F.linear(x, weight)
    return torch.cat([F.linear(piece, weight) for piece in x.split(PIECE_ROWS)])


@functools.cache
def usable(k: int, n: int) -> bool:
    """Whether `bf16_linear` is fast and right here for [N, K] weights (decided once per shape)."""
    if not cpu_kernels.cpu_flags() & set(CPU_FLAGS):
        return False
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(WHOLE_ROWS, k, generator=g), torch.randn(n, k, generator=g) / k**0.5
    w16 = w.bfloat16()
    whole = bf16_linear(x, w16)
    error = nmse(whole[:64], x[:64].double() @ w.double().t())
    same = all(torch.equal(bf16_linear(x[:rows], w16), whole[:rows]) for rows in (1, 5, PIECE_ROWS, 100))
    if error <= NMSE_LIMIT and same:
        return True
    log.warning("bf16 prefill check: [%d, %d] weights fail on this CPU (normalized squared error %.3g, limit %g; "
                "rows the same in any product: %s; flags %s, PyTorch capability %s); prefill stays float32",
                n, k, error, NMSE_LIMIT, same, " ".join(sorted(cpu_kernels.cpu_flags() & set(CPU_FLAGS))),
                torch.backends.cpu.get_cpu_capability())
    return False


@functools.cache
def attention_usable(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether the canonical flash attention runs right on bf16 q/k/v here (PyTorch's bf16 flash kernel needs
    AVX-512 packing: under ATEN_CPU_CAPABILITY=avx2 it raises), with a cached prefix and without."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(200, heads, head_dim, generator=g) for heads in (num_heads, num_kv_heads, num_kv_heads))
    scale = head_dim**-0.5
    try:
        errors = [nmse(bf16_canonical_attention(q[c:], k, v, c, scale),
                        _canonical_flash_attention(q[c:], k, v, c, scale)) for c in (0, 37)]
    except RuntimeError as exc:
        errors, why = [float("inf")], f"{type(exc).__name__}: {exc}"
    else:
        why = f"normalized squared error {max(errors):.3g}, limit {NMSE_LIMIT:g}"
    if max(errors) <= NMSE_LIMIT:
        return True
    log.warning("bf16 prefill check: the attention fails on this CPU (%s; PyTorch capability %s); prefill stays "
                "float32", why, torch.backends.cpu.get_cpu_capability())
    return False


def weight_shape(linear) -> tuple[int, int]:
    """[out, in] of a `Linear`, dense or kept as blocks."""
    blocks = linear.int4
    return tuple(linear.weight.shape) if blocks is None else (blocks.d.shape[0], blocks.d.shape[1] * 32)


def dense_weight(linear) -> torch.Tensor:
    """The float32 [out, in] weight of a `Linear`, from its blocks when it keeps them."""
    blocks = linear.int4
    if blocks is None:
        return linear.weight.data
    n, k = weight_shape(linear)
    w = blocks.unpacked().to(torch.float32).view(n, -1, 32) * blocks.d[..., None]
    return (w if blocks.m is None else w + blocks.m[..., None]).view(n, k)


def use_bf16_prefill(layers, attentions) -> int:
    """Give every linear of `layers` a bf16 prefill weight and every attention of `attentions` bf16 prefill
    attention, when each weight shape proves itself; returns the bytes added (0: the path steps aside)."""
    layers = list(layers)
    if any(m.int4 is not None and not hasattr(m.int4, "unpacked") for m in layers):
        log.warning("bf16 prefill: weights kept in PyTorch's int4 packing (no C kernels) have no dense copy here; "
                    "prefill stays float32")
        return 0
    if not all(usable(k, n) for n, k in map(weight_shape, layers)):
        return 0
    if not all(attention_usable(a.num_heads, a.num_kv_heads, a.head_dim) for a in attentions):
        return 0
    for linear in layers:  # one dense float32 matrix at a time
        linear.prefill_weight = dense_weight(linear).to(torch.bfloat16).contiguous()
    for attention in attentions:
        attention.bf16_prefill = True
    return sum(m.prefill_weight.numel() * 2 for m in layers)
