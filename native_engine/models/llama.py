"""Llama-family decoder (Llama 2/3 and, with q/k/v biases, Qwen2), built from `layers/`.

`tp` (a `TensorParallelGroup`, None alone) builds the rank's shard (`distributed/partition.py`): its query
and KV heads, MLP rows and vocabulary rows; the forward is the same code, the row-parallel layers and the
embedding sum over the group.

`use_fused_decode` (EngineConfig.fused_decode) runs steps of at most `fused_gemv.MAX_ROWS` tokens on CUDA as six
kernels a layer (`kernels/fused_gemv.py`: the norms, SiLU-and-mul and residual adds folded into the GEMVs)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.partition import RankShard, shard_model
from ..forward_context import Context
from ..kernels import qkv_rope_cache
from ..kernels._triton import use_triton
from ..kernels.fused_gemv import MAX_ROWS as FUSED_MAX_ROWS, fused_gemv
from ..layers.activation import SiluAndMul
from ..layers.attention import Attention
from ..layers.embed_head import LMHead, VocabEmbedding
from ..layers.layernorm import RMSNorm
from ..layers.bf16_prefill import use_bf16_prefill
from ..layers.linear import Linear, MergedLinear, QKVLinear, RowParallelLinear, row_parallel
from ..layers.rotary_embedding import RotaryEmbedding
from .cpu_decode import CPUDecodeStack


class LlamaAttention(nn.Module):
    def __init__(self, config, rotary_emb: RotaryEmbedding, shard: RankShard, tp=None) -> None:
        super().__init__()
        nh, nkv, hd = shard.q_heads.size, shard.kv_heads.size, config.head_dim
        self.q_size, self.kv_size = nh * hd, nkv * hd
        self.qkv_proj = QKVLinear(config.hidden_size, hd, config.num_heads, config.num_kv_heads,
                                  bias=config.qkv_bias, shard=shard)
        self.o_proj = row_parallel(nh * hd, config.hidden_size, shard.q_heads.scaled(hd), tp)
        self.rotary_emb = rotary_emb  # one cos/sin table shared by every layer
        self.attn = Attention(nh, hd, hd**-0.5, nkv)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, ctx: Context) -> torch.Tensor:  # [T, H]
        if use_triton(hidden):
            qkv = F.linear(hidden, self.qkv_proj.weight)
            qkv = qkv if self.qkv_proj.lora is None else self.qkv_proj.lora.apply(hidden, qkv)
            return self.o_proj(self.attend(positions, qkv, ctx))
        q, k, v = self.qkv_proj(hidden, ctx.prefill_from).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, ctx), ctx.prefill_from)

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor, ctx: Context) -> torch.Tensor:  # [T, H]
        """Attention over the projected q/k/v on CUDA: one kernel for the bias, the rotary embedding and the
        KV-cache write, then the attention kernel."""
        attn = self.attn
        q, k, v = qkv_rope_cache(qkv, self.qkv_proj.bias, positions, self.rotary_emb.cos_sin_cache, attn.k_cache,
                                 attn.v_cache, ctx.slot_mapping, attn.num_heads, attn.num_kv_heads, attn.head_dim)
        return attn(q, k, v, ctx, cached=True)


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, shard: RankShard, tp=None) -> None:
        super().__init__()
        rows = shard.intermediate
        self.gate_up_proj = MergedLinear(hidden_size, [intermediate_size, intermediate_size], rows=rows)
        self.down_proj = row_parallel(rows.size, hidden_size, rows, tp)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor, prefill_from: int | None = None) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x, prefill_from)), prefill_from)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, rotary_emb: RotaryEmbedding, shard: RankShard, tp=None) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, rotary_emb, shard, tp)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, shard, tp)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, ctx: Context
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, ctx)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden, ctx.prefill_from), residual

    def forward_fused(self, positions: torch.Tensor, hidden: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Six kernels (CUDA, few rows): `hidden` is the residual stream, before and after."""
        attn, mlp, norm1, norm2 = self.self_attn, self.mlp, self.input_layernorm, self.post_attention_layernorm
        qkv = fused_gemv(hidden, attn.qkv_proj.weight, norm=norm1.weight, eps=norm1.eps)
        hidden = fused_gemv(attn.attend(positions, qkv, ctx), attn.o_proj.weight, residual=hidden)
        gate_up = fused_gemv(hidden, mlp.gate_up_proj.weight, norm=norm2.weight, eps=norm2.eps)
        return fused_gemv(gate_up, mlp.down_proj.weight, silu_mul=True, residual=hidden)

    def can_fuse(self) -> bool:
        """Dense, unsharded weights without the biases the fused kernels leave out (q/k/v's are kept)."""
        attn, mlp = self.self_attn, self.mlp
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        return (all(not isinstance(m, RowParallelLinear) and m.int4 is None for m in linears)
                and all(m.bias is None for m in linears[1:]))


class LlamaModel(nn.Module):
    def __init__(self, config, shard: RankShard, tp=None) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, shard.vocab, tp)
        rotary_emb = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta,
                                     config.rope_scaling)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, rotary_emb, shard, tp) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.config = config
        self.cpu_decode: CPUDecodeStack | None = None  # set by `use_cpu_decode` once the KV cache exists
        self.fused_decode = False  # set by `use_fused_decode`

    def use_cpu_decode(self, lm_head=None) -> bool:
        self.cpu_decode = CPUDecodeStack.build(self, lm_head)
        return self.cpu_decode is not None

    def use_bf16_prefill(self) -> int:
        """Prefill rows in bf16 where this CPU proves it (`layers/bf16_prefill.py`); returns the bytes added."""
        linears = [m for layer in self.layers for m in layer.modules() if isinstance(m, Linear)]
        return use_bf16_prefill(linears, [layer.self_attn.attn for layer in self.layers])

    def use_fused_decode(self, device: torch.device) -> bool:
        """Run steps of few tokens through `LlamaDecoderLayer.forward_fused` where every layer can (CUDA only)."""
        self.fused_decode = device.type == "cuda" and all(layer.can_fuse() for layer in self.layers)
        return self.fused_decode

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        if self.cpu_decode is not None and self.cpu_decode.can_run(len(input_ids), ctx):
            return self.cpu_decode(self.embed_tokens(input_ids), positions, ctx)
        if ctx.lora is None and self.fused_decode and len(input_ids) <= FUSED_MAX_ROWS:
            hidden = self.embed_tokens(input_ids)
            for layer in self.layers:
                hidden = layer.forward_fused(positions, hidden, ctx)
            return self.norm(hidden)
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, ctx)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config, tp=None) -> None:
        super().__init__()
        self.config = config
        rank, world_size = (tp.rank, tp.world_size) if tp is not None else (0, 1)
        self.shard = shard_model(config.num_heads, config.num_kv_heads, config.intermediate_size, config.vocab_size,
                                 rank, world_size)
        self.model = LlamaModel(config, self.shard, tp)
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, self.shard.vocab, tp, self.shard.vocab_sizes)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        return self.model(input_ids, positions, ctx)  # [T] -> [T, H]

    def compute_logits(self, hidden: torch.Tensor, ctx: Context) -> torch.Tensor:  # [T, H] -> [S, V] float32
        if ctx.logits is not None:  # the C decode step computed every row's
            rows = ctx.sample_indices
            return ctx.logits if rows is None or len(rows) == len(ctx.logits) else ctx.logits.index_select(0, rows)
        return self.lm_head(hidden, ctx.sample_indices)
