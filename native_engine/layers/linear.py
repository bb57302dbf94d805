"""Linear layers with checkpoint-shard loaders (nano-vllm / vLLM style).

`QKVLinear` packs q/k/v and `MergedLinear` packs gate/up into one GEMM; each parameter
carries a `weight_loader(param, loaded, shard_id)` that copies one checkpoint tensor into
its slice.

Tensor parallelism (Megatron-LM): the packed linears are column-parallel (built with the rank's
rows of each checkpoint matrix: `QKVLinear(shard=...)`, `MergedLinear(rows=...)`), and
`RowParallelLinear` takes the rank's input columns and sums the partial products over the group
(one all-reduce). Their loaders narrow each checkpoint tensor before anything is copied or
dequantized (`loader/lazy.py`), so a rank only ever reads its shard. With one rank they are the
plain layers.

On CPU, oneDNN's bf16 GEMV is about 1.6x slower than the fp16 one at one or two rows,
while fp16 GEMMs are far slower than bf16 at 16 rows. `use_small_batch_weights` gives a
bf16 model an fp16 copy of each weight that serves batches of at most `SMALL_BATCH` rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.partition import RankShard, Span
from ..loader.gguf_loader import Q4Blocks, Q8Blocks
from ..loader.lazy import materialize, narrow
from . import kernel_check
from .bf16_prefill import bf16_linear
from .quant import BlockWeight, Int4Weight, from_blocks, pack_int4, use_block_kernels

SMALL_BATCH = 2


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor | Q4Blocks | Q8Blocks) -> None:
    loaded = materialize(loaded)
    if isinstance(loaded, (Q4Blocks, Q8Blocks)):
        loaded = loaded.dequantize()
    assert param.shape == loaded.shape, f"shape mismatch: {tuple(param.shape)} vs {tuple(loaded.shape)}"
    param.data.copy_(loaded)


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        self.small_batch_weight: torch.Tensor | None = None
        self.small_batch_bias: torch.Tensor | None = None
        self.int4: Int4Weight | BlockWeight | None = None  # set by `use_int4`; the dense weight is then dropped
        self.blocks: Q4Blocks | None = None  # Q4_1 rows as loaded (`load_gguf(keep_q4_1=True)`)
        self.block_ranges: list[tuple[int, int]] = []
        self.lora = None  # a `lora.punica.LoRALayer` when the engine serves adapters
        self.prefill_weight: torch.Tensor | None = None  # bf16 copy for prefill rows (`bf16_prefill.py`)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        loaded = materialize(loaded)
        if isinstance(loaded, Q4Blocks):
            self.load_blocks(0, loaded)
        else:
            default_weight_loader(param, loaded)

    def load_blocks(self, offset: int, blocks: Q4Blocks) -> None:
        """Keep Q4_1 rows [offset, offset + n) as blocks; `finish_loading` packs or dequantizes them."""
        out_features, in_features = self.weight.shape
        assert blocks.shape == (blocks.shape[0], in_features), f"shape mismatch: {tuple(blocks.shape)}"
        if self.blocks is None:
            groups = blocks.d.shape[1]
            self.blocks = Q4Blocks(torch.empty(out_features, in_features, dtype=torch.uint8),
                                   torch.empty(out_features, groups), torch.empty(out_features, groups))
        n = blocks.shape[0]
        for mine, theirs in zip((self.blocks.q, self.blocks.d, self.blocks.m), (blocks.q, blocks.d, blocks.m)):
            mine[offset : offset + n] = theirs
        self.block_ranges.append((offset, n))

    def finish_loading(self, int4: bool) -> int:
        """Pack the blocks as int4 when every row came as one (and `int4`), else write them into the
        dense weight; returns the packed bytes (0 when dense)."""
        blocks, self.blocks = self.blocks, None
        rows = self.weight.shape[0]
        whole = blocks is not None and int4 and sum(n for _, n in self.block_ranges) == rows
        if whole and use_block_kernels(rows) and kernel_check.usable("blocks", blocks.q, blocks.d, blocks.m):
            tiles = kernel_check.usable("tiled", blocks.q, blocks.d, blocks.m)
            self.use_int4(BlockWeight.q4_1(blocks.q, blocks.d, blocks.m, tiles))
        elif whole and rows % 16 == 0 and kernel_check.usable("torch-int4", blocks.q, blocks.d, blocks.m):
            self.use_int4(from_blocks(blocks.q, blocks.d, blocks.m))
        elif blocks is not None:
            dense = blocks.dequantize()
            for offset, n in self.block_ranges:
                self.weight.data[offset : offset + n] = dense[offset : offset + n]
        if (int4 and self.int4 is None and (packed := pack_int4(self.weight.data)) is not None
                and kernel_check.usable("torch-int4", *kernel_check.sample_blocks("q4_1"))):
            self.use_int4(packed)
        return self.int4.nbytes if self.int4 is not None else 0

    def use_int4(self, int4: Int4Weight | BlockWeight) -> None:
        self.int4 = int4
        self.weight = nn.Parameter(torch.empty(0, self.weight.shape[1]), requires_grad=False)

    def forward(self, x: torch.Tensor, prefill_from: int | None = None) -> torch.Tensor:  # x: [T, in]
        """`prefill_from`: the first prefill row (rows before it are decode rows), None: no prefill rows."""
        if self.prefill_weight is not None and prefill_from is not None:
            out = self.prefill_forward(x, prefill_from)
        elif (out := self.tiled_lora_forward(x)) is not None:
            return out
        else:
            out = self.base_forward(x)
        return out if self.lora is None else self.lora.apply(x, out)

    def tiled_lora_forward(self, x: torch.Tensor) -> torch.Tensor | None:  # x: [T, in]
        """The tiled matmul with the step's adapter rows added in the same C call (`cpu_batch.TiledBlocks.matmul`:
        each tile's LoRA expand while its outputs are in cache, no second pass over them), when the rows take the
        tiled kernel and the adapters are stored for the C kernels; None otherwise (the base, then
        `LoRALayer.apply`)."""
        if self.lora is None or not isinstance(self.int4, BlockWeight) or (tiled := self.int4.tiled_for(x)) is None:
            return None
        if (rows := self.lora.c_rows(x)) is None:
            return None
        out = tiled.matmul(x, rows)
        self.lora.fused_rows += x.shape[0]
        return out if self.bias is None else out.add_(self.bias)

    def prefill_forward(self, x: torch.Tensor, prefill_from: int) -> torch.Tensor:  # x: [T, in]
        """Decode rows as `base_forward`, prefill rows through the bf16 weight."""
        prefill = bf16_linear(x[prefill_from:], self.prefill_weight, self.bias)
        return prefill if prefill_from == 0 else torch.cat([self.base_forward(x[:prefill_from]), prefill])

    def base_forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, in]
        if self.int4 is not None:
            out = self.int4.matmul(x)
            return out if self.bias is None else out.add_(self.bias)
        if self.small_batch_weight is not None and x.shape[0] <= SMALL_BATCH:
            return F.linear(x.to(torch.float16), self.small_batch_weight, self.small_batch_bias).to(x.dtype)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(Linear):
    """Input columns `cols` of an [out, in] checkpoint matrix; the partial products are summed over the
    group, and the bias is added once (rank 0's)."""

    def __init__(self, out_features: int, cols: Span, tp, bias: bool = False) -> None:
        super().__init__(cols.size, out_features, bias)
        self.cols, self.tp = cols, tp

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        if param is self.bias:
            loaded = materialize(loaded) if self.tp.rank == 0 else torch.zeros_like(param)
        else:
            loaded = narrow(loaded, 1, self.cols.start, self.cols.size)
        super().weight_loader(param, loaded, shard_id)

    def forward(self, x: torch.Tensor, prefill_from: int | None = None) -> torch.Tensor:  # [T, in / ranks] -> [T, out]
        return self.tp.all_reduce(super().forward(x, prefill_from))


def row_parallel(in_features: int, out_features: int, cols: Span, tp, bias: bool = False) -> Linear:
    """`RowParallelLinear` in a group, the plain `Linear` alone."""
    return Linear(in_features, out_features, bias) if tp is None else RowParallelLinear(out_features, cols, tp, bias)


class _PackedLinear(Linear):
    """A linear whose output rows are the concatenation of named checkpoint shards; `sources` gives the
    first checkpoint row of each (0 without tensor parallelism: the whole shard)."""

    def __init__(self, in_features: int, shard_sizes: dict[object, int], bias: bool,
                 sources: dict[object, int] | None = None) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias)
        self.shard_offsets: dict[object, tuple[int, int]] = {}
        self.sources = sources or {}
        offset = 0
        for shard_id, size in shard_sizes.items():
            self.shard_offsets[shard_id] = (offset, size)
            offset += size

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        offset, size = self.shard_offsets[shard_id]
        loaded = materialize(narrow(loaded, 0, self.sources.get(shard_id, 0), size))
        if isinstance(loaded, Q4Blocks):
            assert loaded.shape[0] == size, f"shard {shard_id!r}: {loaded.shape[0]} rows, expected {size}"
            self.load_blocks(offset, loaded)
        else:
            default_weight_loader(param.data.narrow(0, offset, size), loaded)


class QKVLinear(_PackedLinear):
    """q, k and v projections in one GEMM; with `shard`, the rank's query and KV heads only."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool,
                 shard: RankShard | None = None) -> None:
        q = shard.q_heads.scaled(head_dim) if shard else Span(0, num_heads * head_dim)
        kv = shard.kv_heads.scaled(head_dim) if shard else Span(0, num_kv_heads * head_dim)
        super().__init__(hidden_size, {"q": q.size, "k": kv.size, "v": kv.size}, bias,
                         {"q": q.start, "k": kv.start, "v": kv.start})


class MergedLinear(_PackedLinear):
    """Several projections of one input in one GEMM (gate/up); with `rows`, those rows of each."""

    def __init__(self, in_features: int, out_features: list[int], bias: bool = False, rows: Span | None = None
                 ) -> None:
        sizes = [rows.size] * len(out_features) if rows else out_features
        super().__init__(in_features, dict(enumerate(sizes)), bias,
                         dict.fromkeys(range(len(sizes)), rows.start) if rows else None)


def use_small_batch_weights(model: nn.Module) -> int:
    """Give every bf16 `Linear` an fp16 weight copy for small batches; returns the bytes added."""
    added = 0
    for module in model.modules():
        if isinstance(module, Linear) and module.weight.dtype == torch.bfloat16:
            module.small_batch_weight = module.weight.data.to(torch.float16)
            if module.bias is not None:
                module.small_batch_bias = module.bias.data.to(torch.float16)
            added += module.small_batch_weight.numel() * 2
    return added


def finish_loading(model: nn.Module, int4: bool, skip: tuple[type, ...] = ()) -> int:
    """`Linear.finish_loading` for every linear but `skip`; returns the bytes of int4 weights."""
    return sum(m.finish_loading(int4) for m in model.modules() if isinstance(m, Linear) and not isinstance(m, skip))
