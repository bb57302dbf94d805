"""The FLOPs method of the source documents, as written in estimate.md §1 (dense decoder, SwiGLU, GQA).

Parameters (no norms, no biases, embeddings once): ``V·h + L·(3·h·i + 2·h² + 2·h²·kv/a)``
(``shape.parameter_count``, beside the shape: its weight bytes need it).
Prefill, whole prompt of ``p`` tokens: ``(4·(1 + kv/a)·p·h² + 4·p²·h + 6·p·h·i)·L·b``.
Decode, per output token averaged over ``o`` steps: ``(4·(1 + kv/a)·h² + 6·h·i + 4·(p + (1+o)/2)·h)·L·b``.
``TTFT ≈ prefill / F`` and ``throughput ≈ F / decode-per-token`` at peak ``F``; rule of thumb ``2·b·p·P``
and ``2·b·P``.
"""

from __future__ import annotations

from .shape import ModelShape, parameter_count


def prefill_flops(m: ModelShape, prompt: int, batch: int = 1) -> float:
    h, i, p = m.hidden_size, m.intermediate_size, prompt
    return (4 * (1 + m.kv_ratio) * p * h * h + 4 * p * p * h + 6 * p * h * i) * m.num_layers * batch


def decode_flops_per_token(m: ModelShape, prompt: int, output: int, batch: int = 1) -> float:
    h, i = m.hidden_size, m.intermediate_size
    attention = 4 * (prompt + (1 + output) / 2) * h
    return (4 * (1 + m.kv_ratio) * h * h + 6 * h * i + attention) * m.num_layers * batch


def rule_of_thumb(m: ModelShape, prompt: int, batch: int = 1) -> tuple[float, float]:
    """(prefill FLOPs ≈ 2·b·p·P, decode FLOPs per step ≈ 2·b·P)."""
    params = parameter_count(m)
    return 2 * batch * prompt * params, 2 * batch * params
