"""Deterministic random weights, one tensor at a time, in Hugging Face layout.

Every tensor has its own generator seeded from ``(seed, crc32(name))``, so a
tensor can be produced on demand in any order and both output formats see
exactly the same numbers. Linear weights are ``[out_features, in_features]``.

Embeddings, the LM head and biases are N(0, init_std). Projection matrices are
N(0, 1/in_features) so every layer keeps activations at unit scale; with a
tiny hidden size and init_std-sized projections the layers would barely touch
the residual stream, and a tied-embedding model would just repeat its last
input token.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .spec import ModelSpec


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    kind: str  # "embedding", "linear", "bias" or "norm" (ones)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape))


def _layer_tensors(spec: ModelSpec, i: int) -> list[TensorSpec]:
    h, inter, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q_out, kv_out = spec.num_heads * hd, spec.num_kv_heads * hd
    p = f"model.layers.{i}."
    out = [TensorSpec(p + "input_layernorm.weight", (h,), "norm")]
    for proj, rows in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
        out.append(TensorSpec(f"{p}self_attn.{proj}.weight", (rows, h), "linear"))
        if spec.qkv_bias:
            out.append(TensorSpec(f"{p}self_attn.{proj}.bias", (rows,), "bias"))
    out += [
        TensorSpec(p + "self_attn.o_proj.weight", (h, q_out), "linear"),
        TensorSpec(p + "post_attention_layernorm.weight", (h,), "norm"),
        TensorSpec(p + "mlp.gate_proj.weight", (inter, h), "linear"),
        TensorSpec(p + "mlp.up_proj.weight", (inter, h), "linear"),
        TensorSpec(p + "mlp.down_proj.weight", (h, inter), "linear"),
    ]
    return out


def tensor_specs(spec: ModelSpec) -> list[TensorSpec]:
    """All tensors of the model, in checkpoint order (HF names)."""
    out = [TensorSpec("model.embed_tokens.weight", (spec.vocab_size, spec.hidden_size), "embedding")]
    for i in range(spec.num_layers):
        out += _layer_tensors(spec, i)
    out.append(TensorSpec("model.norm.weight", (spec.hidden_size,), "norm"))
    if not spec.tie_embeddings:
        out.append(TensorSpec("lm_head.weight", (spec.vocab_size, spec.hidden_size), "embedding"))
    return out


def make_tensor(spec: ModelSpec, ts: TensorSpec, seed: int) -> np.ndarray:
    """The float32 values of one tensor (see the module docstring for the distributions)."""
    if ts.kind == "norm":
        return np.ones(ts.shape, dtype=np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(ts.name.encode("utf-8"))])
    values = rng.standard_normal(ts.shape, dtype=np.float32)
    values *= np.float32(1.0 / np.sqrt(ts.shape[1]) if ts.kind == "linear" else spec.init_std)
    return values


def iter_tensors(spec: ModelSpec, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, float32 array) for every tensor, generated lazily."""
    for ts in tensor_specs(spec):
        yield ts.name, make_tensor(spec, ts, seed)


def parameter_count(spec: ModelSpec) -> int:
    return sum(ts.numel for ts in tensor_specs(spec))
