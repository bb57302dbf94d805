"""The Llama decoder stack as one C call per decode step (`llama_decode` in kernels/cpu_kernels.c).

On CPU in float32 with every linear kept as Q4_1 blocks (`layers/quant.BlockWeight`), a decode step of
a 30-layer model is some 400 small kernel calls; from Python each costs several microseconds of module
and ctypes overhead, about as much as the arithmetic itself on a small model. `CPUDecodeStack` gathers
the weight, norm and KV-cache pointers of every layer once (after the KV cache is allocated) and runs the
same maths as `LlamaModel.forward` in C for batches of one-token rows. Prefill chunks, other dtypes and
weights that are not Q4_1 blocks keep the module path. Batches of 4+ rows go to `llama_decode_batch`
(kernels/cpu_batch.c: tiled int16 matmuls, attention a KV head group at a time) when every linear has
tiled blocks.
"""

from __future__ import annotations

import torch

from ..forward_context import Context
from ..kernels import cpu_batch, cpu_kernels
from ..layers.quant import BlockWeight

_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


class CPUDecodeStack:
    def __init__(self, model, pointers: torch.Tensor, batch_pointers: torch.Tensor | None = None) -> None:
        self.model, self.pointers = model, pointers  # the model's tensors keep every pointer alive
        self.batch_pointers = batch_pointers  # the same with tiled weights, for `llama_decode_batch`
        config = model.config
        self.shape = (config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
                      config.intermediate_size)

    @classmethod
    def build(cls, model) -> CPUDecodeStack | None:
        """For a `LlamaModel` whose layers all qualify, else None."""
        if cpu_kernels.library() is None or not model.layers:
            return None
        rows = [_layer_pointers(layer) for layer in model.layers]
        if any(r is None for r in rows) or not model.norm.weight.dtype == torch.float32:
            return None
        batch = [_tiled_pointers(layer, row) for layer, row in zip(model.layers, rows, strict=True)]
        config = model.config
        if any(r is None for r in batch) or not cpu_batch.serves_attention(config.num_heads, config.num_kv_heads,
                                                                            config.head_dim):
            batch = None
        return cls(model, torch.tensor(rows, dtype=torch.int64),
                   None if batch is None else torch.tensor(batch, dtype=torch.int64))

    def can_run(self, num_tokens: int, ctx: Context) -> bool:
        return num_tokens > 0 and ctx.num_decode_tokens == num_tokens and not ctx.prefills

    def __call__(self, hidden: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        # hidden: [T, H] token embeddings -> [T, H] after the final norm
        hidden = hidden.contiguous()
        h, nh, nkv, d, inter = self.shape
        attn = self.model.layers[0].self_attn.attn
        positions, slots = positions.to(torch.int64).contiguous(), ctx.slot_mapping.to(torch.int64).contiguous()
        tables = ctx.block_tables.to(torch.int32).contiguous()
        lens = ctx.context_lens.to(torch.int32).contiguous()
        rotary = self.model.layers[0].self_attn.rotary_emb.cos_sin_cache
        batched = self.batch_pointers is not None and hidden.shape[0] >= cpu_batch.MIN_ROWS
        decode = cpu_batch.library().llama_decode_batch if batched else cpu_kernels.library().llama_decode
        pointers = self.batch_pointers if batched else self.pointers
        decode(
            len(self.model.layers), hidden.shape[0], hidden.data_ptr(), positions.data_ptr(), slots.data_ptr(),
            tables.data_ptr(), lens.data_ptr(), tables.shape[1], h, nh, nkv, d, inter, self.model.norm.eps,
            rotary.data_ptr(), attn.k_cache.shape[1], pointers.data_ptr(), self.model.norm.weight.data_ptr(),
            attn.scale, torch.get_num_threads())
        return hidden


def _layer_pointers(layer) -> list[int] | None:
    linears = [layer.get_submodule(name) for name in _LINEARS]
    weights = [lin.int4 for lin in linears]
    if not all(isinstance(w, BlockWeight) and w.m is not None for w in weights):
        return None
    if any(lin.bias is not None for lin in linears[1:]):
        return None
    attn, norms = layer.self_attn.attn, (layer.input_layernorm, layer.post_attention_layernorm)
    caches = (attn.k_cache, attn.v_cache)
    if not all(c.dtype == torch.float32 and c.is_contiguous() and c.numel() for c in caches):
        return None
    if attn.k_cache.shape[1] > 256 or attn.head_dim > 256:
        return None
    qkv_bias = linears[0].bias.data_ptr() if linears[0].bias is not None else 0
    out = [weights[0].qs.data_ptr(), weights[0].d.data_ptr(), weights[0].m.data_ptr(), qkv_bias]
    for w in weights[1:]:
        out += [w.qs.data_ptr(), w.d.data_ptr(), w.m.data_ptr()]
    return out + [n.weight.data_ptr() for n in norms] + [c.data_ptr() for c in caches]


def _tiled_pointers(layer, row: list[int]) -> list[int] | None:
    """`row` (see `_layer_pointers`) with each linear's blocks replaced by their tiles, or None without tiles."""
    tiles = [layer.get_submodule(name).int4.tiled for name in _LINEARS]
    if any(t is None or t.mt is None for t in tiles):
        return None
    qkv, o, gate_up, down = (t.pointers for t in tiles)
    return [*qkv, row[3], *o, *gate_up, *down, *row[13:]]
