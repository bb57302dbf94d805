"""The Llama decoder stack as one C call per decode step (`llama_decode` / `llama_decode_rows` in kernels/).

On CPU in float32 with every linear kept as Q4_1 blocks (`layers/quant.BlockWeight`), a decode step of
a 30-layer model is some 400 small kernel calls; from Python each costs several microseconds of module
and ctypes overhead, about as much as the arithmetic itself on a small model. `CPUDecodeStack` gathers
the weight, norm and KV-cache pointers of every layer once (after the KV cache is allocated) and runs the
same maths as `LlamaModel.forward` in C for batches of one-token rows:

- 1..ROWS_MAX rows (single-stream decode): `llama_decode_rows` (cpu_decode.c), one OpenMP region per step,
  weights read with float16 block scales (copies made here, exact: GGUF stores them as float16), and the
  LM head too when it is Q8_0 blocks; the logits land in `ctx.logits`.
- ROWS_MAX+1.. rows: `llama_decode_batch` (cpu_batch.c: tiled int16 matmuls, attention a KV head group
  at a time, one OpenMP region per step as above) when every linear has tiled blocks and the shape is served
  (`cpu_batch.serves_decode_batch`), else `llama_decode` (cpu_kernels.c); the LM head stays in Python.

Verify steps of speculative decoding (a row's last token and its drafts, `ctx.verify_offsets`) take
`llama_decode_batch` from two query rows on: its cost hardly grows with the rows (1-thread SmolLM2, 5
rows: ~1.3x one row's step) where `llama_decode_rows` grows ~linearly; `llama_decode_rows` serves them too
(each query reads its verify row's earlier keys from their qkv rows) where the tiled kernel is missing.

LoRA: a step with adapter rows (`ctx.lora`) runs in `llama_decode_batch` too, from one row on (so the last
1-3 rows of a batch through adapters do not fall back to the per-layer path: 1.45x a C step at 16 rows), when
every adapted linear's stacks are float16 on the CPU with Bᵀ's tile-major copy (`lora/punica.py`): per linear, one
more op computes each adapter row's shrink (x · Aᵀ of its slot; a run of rows of one slot in groups of up to 8, its A
requested towards L2 an op ahead), and each matmul tile adds its rows' expand (u · Bᵀ) before the next op reads it
(Punica's BGMV, fused into the step).
Other LoRA steps (verify steps, other dtypes) keep the module path.

Prefill chunks, other dtypes and weights that are not Q4_1 blocks keep the module path.
"""

from __future__ import annotations

import torch

from ..forward_context import Context
from ..kernels import cpu_batch, cpu_kernels
from ..layers import kernel_check
from ..layers.quant import BlockWeight

_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
ROWS_MAX = 3  # decode steps of up to this many rows take llama_decode_rows
_MAX_K, _MAX_N = 16384, 32 * 1024  # cpu_decode.c: MAX_GROUPS * 32, ROWS_PER_CHUNK * MAX_CHUNKS


class CPUDecodeStack:
    def __init__(self, model, pointers: torch.Tensor, rows: tuple[torch.Tensor, list] | None,
                 head: BlockWeight | None, head_d16: torch.Tensor | None) -> None:
        self.model, self.pointers = model, pointers  # the model's tensors keep every pointer alive
        self.rows = rows  # (pointers with float16 scales, the float16 scale tensors they point to) or None
        self.head, self.head_d16 = head, head_d16
        self.batch_pointers: torch.Tensor | None = None  # `pointers` with tiled weights, for llama_decode_batch
        self._lora_table: tuple[list, torch.Tensor | None] | None = None  # (the tensors it was built from, lora_w)
        # every layer's linears (qkv, o, gate_up, down), looked up once: a step reads their `lora` (get_submodule
        # for all 120 of SmolLM2 took ~0.5 ms, twice per LoRA step)
        self.linears = [layer.get_submodule(name) for layer in model.layers for name in _LINEARS]
        config = model.config
        self.shape = (config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
                      config.intermediate_size)

    @classmethod
    def build(cls, model, lm_head=None) -> CPUDecodeStack | None:
        """For a `LlamaModel` whose layers all qualify, else None. `lm_head`: the `LMHead` computed in the
        same call for 1..ROWS_MAX rows when it is Q8_0 blocks."""
        if cpu_kernels.library() is None or not model.layers:
            return None
        rows = [_layer_pointers(layer) for layer in model.layers]
        if any(r is None for r in rows) or not model.norm.weight.dtype == torch.float32:
            return None
        head = _q8_head(lm_head)
        head_d16 = _exact_f16(head.d) if head is not None else None
        stack = cls(model, torch.tensor(rows, dtype=torch.int64), _rows_pointers(model),
                    head if head_d16 is not None else None, head_d16)
        batch = [_tiled_pointers(layer, row) for layer, row in zip(model.layers, rows, strict=True)]
        config = model.config
        if all(r is not None for r in batch) and cpu_batch.serves_attention(config.num_heads, config.num_kv_heads,
                                                                             config.head_dim):
            stack.batch_pointers = torch.tensor(batch, dtype=torch.int64)
        return stack

    def can_run(self, num_tokens: int, ctx: Context) -> bool:
        if not (num_tokens > 0 and ctx.num_decode_tokens == num_tokens and not ctx.prefills):
            return False
        return ctx.lora is None or (ctx.verify_offsets is None and self._batch_serves(num_tokens, ctx)
                                    and self._lora_pointers() is not None)

    def _batch_serves(self, num_rows: int, ctx: Context) -> bool:
        h, nh, nkv, d, inter = self.shape
        if ctx.verify_offsets is not None:
            rows_for_batch = 2
        elif ctx.lora is not None:  # llama_decode_rows has no LoRA; the module path costs far more than a batch step
            rows_for_batch = 1
        else:
            rows_for_batch = max(ROWS_MAX + 1, cpu_batch.MIN_ROWS)
        return (self.batch_pointers is not None and num_rows >= rows_for_batch
                and cpu_batch.serves_decode_batch(num_rows, h, nh, nkv, d, inter))

    def _lora_pointers(self) -> torch.Tensor | None:
        """llama_decode_batch's lora_w: per layer and linear (qkv, o, gate_up, down) its adapters' stacks (a, Bᵀ's
        tiles, ranks, R, blocks, blocks per slot, the tiles' rank; zeros where none is loaded), or None when one
        is not float16 on the CPU or has no tiles (`LoRALayer.c_fields`). Rebuilt when one of those changes (an
        adapter put into a slot)."""
        loras = [getattr(linear, "lora", None) for linear in self.linears]
        tensors = [lora.c_fields for lora in loras if lora is not None]  # a new one per adapter put in a slot
        # the cache holds the tensors it was built from, so an id seen again is the same tensor, never a new one
        if self._lora_table is None or [id(t) for t in self._lora_table[0]] != [id(t) for t in tensors]:
            self._lora_table = (tensors, _lora_table(loras))
        return self._lora_table[1]

    def __call__(self, hidden: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        # hidden: [T, H] token embeddings -> [T, H] after the final norm
        hidden = hidden.contiguous()
        h, nh, nkv, d, inter = self.shape
        attn = self.model.layers[0].self_attn.attn
        positions, slots = positions.to(torch.int64).contiguous(), ctx.slot_mapping.to(torch.int64).contiguous()
        tables = ctx.block_tables.to(torch.int32).contiguous()
        lens = ctx.context_lens.to(torch.int32).contiguous()
        rotary = self.model.layers[0].self_attn.rotary_emb.cos_sin_cache
        args = (len(self.model.layers), hidden.shape[0], hidden.data_ptr(), positions.data_ptr(), slots.data_ptr(),
                tables.data_ptr(), lens.data_ptr(), tables.shape[1], h, nh, nkv, d, inter, self.model.norm.eps,
                rotary.data_ptr(), attn.k_cache.shape[1])
        lib = cpu_kernels.library()
        if self._batch_serves(hidden.shape[0], ctx):
            lora_slots = None if ctx.lora is None else ctx.lora.row_slots(hidden.shape[0])
            lora_w = None if lora_slots is None else self._lora_pointers()
            cpu_batch.library().llama_decode_batch(*args, self.batch_pointers.data_ptr(),
                                                   self.model.norm.weight.data_ptr(), attn.scale,
                                                   None if lora_slots is None else lora_slots.data_ptr(),
                                                   None if lora_slots is None else lora_w.data_ptr(),
                                                   torch.get_num_threads())
            return hidden
        if self.rows is None or hidden.shape[0] > ROWS_MAX:
            lib.llama_decode(*args, self.pointers.data_ptr(), self.model.norm.weight.data_ptr(), attn.scale,
                             torch.get_num_threads())
            return hidden
        logits, head = None, (None, None, 0)
        if self.head is not None:
            logits = torch.empty(hidden.shape[0], self.head.qs.shape[0])
            head = (self.head.qs.data_ptr(), self.head_d16.data_ptr(), self.head.qs.shape[0])
        verify = ctx.verify_offsets  # verify rows: queries that read this step's keys from their qkv rows
        lib.llama_decode_rows(*args, self.rows[0].data_ptr(), self.model.norm.weight.data_ptr(), attn.scale, *head,
                              None if logits is None else logits.data_ptr(),
                              None if verify is None else verify.data_ptr(), torch.get_num_threads())
        ctx.logits = logits
        return hidden


def _lora_table(loras: list) -> torch.Tensor | None:
    table = []
    for lora in loras:
        if lora is None or lora.a is None:
            table += [0] * 7
        elif lora.c_fields is None:
            return None
        else:
            table += lora.c_fields.tolist()
    return torch.tensor(table, dtype=torch.int64)


def _linears(layer) -> list[BlockWeight] | None:
    linears = [layer.get_submodule(name) for name in _LINEARS]
    weights = [lin.int4 for lin in linears]
    if not all(isinstance(w, BlockWeight) and w.m is not None for w in weights):
        return None
    if any(lin.bias is not None for lin in linears[1:]):
        return None
    return weights


def _layer_pointers(layer) -> list[int] | None:
    weights = _linears(layer)
    if weights is None:
        return None
    attn, norms = layer.self_attn.attn, (layer.input_layernorm, layer.post_attention_layernorm)
    caches = (attn.k_cache, attn.v_cache)
    if not all(c.dtype == torch.float32 and c.is_contiguous() and c.numel() for c in caches):
        return None
    if attn.k_cache.shape[1] > 256 or attn.head_dim > 256:
        return None
    bias = layer.self_attn.qkv_proj.bias
    out = [weights[0].qs.data_ptr(), weights[0].d.data_ptr(), weights[0].m.data_ptr(), 0 if bias is None else bias.data_ptr()]
    for w in weights[1:]:
        out += [w.qs.data_ptr(), w.d.data_ptr(), w.m.data_ptr()]
    return out + [n.weight.data_ptr() for n in norms] + [c.data_ptr() for c in caches]


def _rows_pointers(model) -> tuple[torch.Tensor, list] | None:
    """llama_decode_rows' pointer table (the same as llama_decode's with float16 d and m), or None when a
    scale is not exactly a float16 or a shape is outside what cpu_decode.c takes."""
    table, keep = [], []
    if model.config.num_heads * ROWS_MAX + 1 > 1024:  # attention chunks per op <= MAX_CHUNKS
        return None
    if not kernel_check.usable_weight("decode-rows", _linears(model.layers[0])[0]):
        return None
    for layer in model.layers:
        row = _layer_pointers(layer)
        for i, w in enumerate(_linears(layer)):
            if w.qs.shape[0] % 2 or w.qs.shape[0] > _MAX_N or w.qs.shape[1] * 2 > _MAX_K:
                return None
            d16, m16 = _exact_f16(w.d), _exact_f16(w.m)
            if d16 is None or m16 is None:
                return None
            keep += [d16, m16]
            qs_at = 0 if i == 0 else 1 + 3 * i  # [qkv qs, d, m, bias, o qs, d, m, gate_up ..., down ..., ...]
            row[qs_at + 1 : qs_at + 3] = [d16.data_ptr(), m16.data_ptr()]
        table.append(row)
    return torch.tensor(table, dtype=torch.int64), keep


def _exact_f16(t: torch.Tensor) -> torch.Tensor | None:
    half = t.to(torch.float16)
    return half if torch.equal(half.float(), t) else None


def _q8_head(lm_head) -> BlockWeight | None:
    packed = getattr(lm_head, "packed", ())
    if len(packed) == 1 and isinstance(packed[0], BlockWeight) and packed[0].m is None:
        head = packed[0]
        if head.qs.shape[0] % 2 == 0 and head.qs.shape[1] <= _MAX_K and kernel_check.usable_weight("decode-rows", head):
            return head
    return None


def _tiled_pointers(layer, row: list[int]) -> list[int] | None:
    """`row` (see `_layer_pointers`) with each linear's blocks replaced by their tiles, or None without tiles."""
    tiles = [w.tiled for w in _linears(layer)]
    if any(t is None or t.mt is None for t in tiles):
        return None
    qkv, o, gate_up, down = (t.pointers for t in tiles)
    return [*qkv, row[3], *o, *gate_up, *down, *row[13:]]
