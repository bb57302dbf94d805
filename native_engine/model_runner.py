"""Builds the model, owns the paged KV cache, turns scheduled sequences into tensors, runs
the forward pass and samples."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import numpy as np
import torch

from .config import EngineConfig
from .cuda_graph import DecodeGraphs
from .layers.attention import Attention
from .layers.embed_head import LMHead, VocabEmbedding
from .layers.linear import finish_loading, use_small_batch_weights
from .layers.sampler import SampledToken, Sampler, SamplingRow
from .models import model_class
from .forward_context import Context, PrefillChunk
from .utils.loader import load_weights


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """On CPU through numpy's calloc: the OS hands out zero pages as they are first touched, so a
    large KV cache costs neither startup time nor memory until it is used."""
    if device.type != "cpu" or dtype == torch.bfloat16:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.from_numpy(np.zeros(shape, dtype=torch.empty((), dtype=dtype).numpy().dtype))


def bytes_per_token(model_config, dtype: torch.dtype) -> int:
    """KV bytes per token: 2 (K and V) x layers x kv heads x head dim x dtype bytes."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * model_config.num_layers * model_config.num_kv_heads * model_config.head_dim * element


def decode_first(scheduled: list) -> list:
    """The batch layout `Attention` expects: one-token rows, then prefill chunks."""
    return sorted(scheduled, key=lambda s: s.num_new_tokens > 1)


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config, weights: Iterable, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.config, self.model_config, self.device, self.dtype = config, model_config, device, dtype
        with torch.device(device), _default_dtype(dtype):
            self.model = model_class(model_config.architecture)(model_config)
        load_weights(self.model, weights)
        self.model.eval()
        self.extra_weight_bytes = 0
        if device.type == "cpu" and dtype == torch.bfloat16 and config.cpu_fp16_small_batch:
            self.extra_weight_bytes = use_small_batch_weights(self.model)
        self.int4_weight_bytes = self._finish_loading(device.type == "cpu" and dtype == torch.float32
                                                      and config.cpu_int4_matmul)
        self.block_bytes = config.block_size * bytes_per_token(model_config, dtype)
        self.num_kvcache_blocks = 0
        self.kv_cache = torch.empty(0)
        self.sampler = Sampler()
        self.graphs: DecodeGraphs | None = None
        self.generators: dict[tuple[str, int], torch.Generator] = {}
        self.seed_rng = torch.Generator().manual_seed(config.seed)  # seeds for requests that bring none

    def _finish_loading(self, int4: bool) -> int:
        """Q4_1 blocks become int4 weights (`int4`) or dense ones; the LM head keeps its dense weight
        (usually the token embedding too) and gets packed copies. Returns the int4 bytes."""
        packed = finish_loading(self.model, int4, skip=(LMHead,))
        head = next((m for m in self.model.modules() if isinstance(m, LMHead)), None)
        if head is None:
            return packed
        head.finish_loading(int4=False)
        tied = getattr(self.model_config, "tie_word_embeddings", False)
        embed = next((m for m in self.model.modules() if isinstance(m, VocabEmbedding)), None)
        source = embed.q8_blocks if tied and embed is not None else None
        if embed is not None:
            embed.q8_blocks = None
        return packed + (head.use_packed_weights(source) if int4 else 0)

    def allocate_kv_cache(self, num_bytes: int) -> int:
        """One tensor [2, layers, blocks, block_size, kv_heads, head_dim]; each layer gets its K and V views."""
        mc = self.model_config
        self.num_kvcache_blocks = max(num_bytes // self.block_bytes, 0)
        shape = (2, mc.num_layers, self.num_kvcache_blocks, self.config.block_size, mc.num_kv_heads, mc.head_dim)
        self.kv_cache = _zeros(shape, self.dtype, self.device)
        layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        for i, attn in enumerate(layers):
            attn.k_cache, attn.v_cache = self.kv_cache[0, i], self.kv_cache[1, i]
        if self.device.type == "cpu" and hasattr(self.model, "model") and hasattr(self.model.model, "use_cpu_decode"):
            self.model.model.use_cpu_decode(getattr(self.model, "lm_head", None))  # decode steps in one C call
        return self.num_kvcache_blocks

    def capture_cudagraphs(self, max_model_len: int) -> None:
        """CUDA graphs for decode batches up to `max_num_seqs` (GPU only; `enforce_eager` turns them off)."""
        if self.device.type != "cuda" or self.config.enforce_eager:
            return
        max_blocks = -(-max_model_len // self.config.block_size)
        self.graphs = DecodeGraphs(self.model, min(self.config.max_num_seqs, 512), max_blocks,
                                   self.model_config.hidden_size, self.device, self.dtype)

    def profile_run(self) -> None:
        """A forward over the step token budget without the cache: the activation peak for KV sizing."""
        n = min(self.config.max_num_batched_tokens, self.model_config.max_position_embeddings)
        self.score([0] * n)

    def weight_bytes(self) -> int:
        """Bytes of the weights as computed with: dense parameters plus int4 packed ones."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters()) + self.int4_weight_bytes

    # -- inputs -------------------------------------------------------------------------------

    def _slots(self, seq, start: int, end: int) -> list[int]:
        bs, table = self.config.block_size, seq.block_table
        return [table[pos // bs] * bs + pos % bs for pos in range(start, end)]

    def prepare_inputs(self, ordered: list) -> tuple[torch.Tensor, torch.Tensor, Context]:
        """`ordered`: one-token (decode) rows first, then prefill chunks (see `decode_first`)."""
        decodes = [s for s in ordered if s.num_new_tokens == 1]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        ctx = Context(num_decode_tokens=len(decodes))
        sample_rows: list[int] = []
        for s in ordered:
            seq, start = s.seq, s.seq.num_computed_tokens
            end = start + s.num_new_tokens
            if s.num_new_tokens > 1:
                table = torch.tensor(seq.block_table, dtype=torch.int32, device=self.device)
                ctx.prefills.append(PrefillChunk(len(input_ids), s.num_new_tokens, end, table))
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += self._slots(seq, start, end)
            if s.should_sample:
                sample_rows.append(len(input_ids) - 1)
        self._prepare_decode(ctx, decodes)
        as_tensor = lambda values, dtype: torch.tensor(values, dtype=dtype, device=self.device)  # noqa: E731
        ctx.slot_mapping = as_tensor(slots, torch.long)
        ctx.sample_indices = as_tensor(sample_rows, torch.long)
        return as_tensor(input_ids, torch.long), as_tensor(positions, torch.long), ctx

    def _prepare_decode(self, ctx: Context, decodes: list) -> None:
        if not decodes:
            return
        width = max(len(s.seq.block_table) for s in decodes)
        tables = [s.seq.block_table + [-1] * (width - len(s.seq.block_table)) for s in decodes]
        ctx.block_tables = torch.tensor(tables, dtype=torch.int32, device=self.device)
        lens = [s.seq.num_computed_tokens + 1 for s in decodes]
        ctx.context_lens = torch.tensor(lens, dtype=torch.int32, device=self.device)

    # -- execution ----------------------------------------------------------------------------

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        for src, dst in pairs:
            self.kv_cache[:, :, dst].copy_(self.kv_cache[:, :, src])

    @torch.inference_mode()
    def run(self, scheduled: list, blocks_to_copy: list[tuple[int, int]] = ()) -> dict[int, list[SampledToken]]:
        """Forward the scheduled chunks; returns `num_samples` tokens for each sequence that samples."""
        self.copy_blocks(list(blocks_to_copy))
        ordered = decode_first(scheduled)
        input_ids, positions, ctx = self.prepare_inputs(ordered)
        if self.graphs is not None and self.graphs.can_run(ctx, len(input_ids)):
            hidden = self.graphs.run(input_ids, positions, ctx)
        else:
            hidden = self.model(input_ids, positions, ctx)
        logits = self.model.compute_logits(hidden, ctx)
        rows = [(s.seq, i) for s in ordered if s.should_sample for i in range(s.num_samples)]
        sampled = self.sampler(logits.repeat_interleave(self._counts(ordered), dim=0) if len(rows) > len(logits)
                               else logits, [self._sampling_row(seq, i) for seq, i in rows])
        tokens: dict[int, list[SampledToken]] = {}
        for (seq, _), token in zip(rows, sampled, strict=True):
            tokens.setdefault(seq.seq_id, []).append(token)
        return tokens

    @torch.inference_mode()
    def score(self, token_ids: list[int]) -> torch.Tensor:
        """Logits at every position of one prompt ([n, V] float32), computed without the KV cache."""
        n = len(token_ids)
        ctx = Context(prefills=[PrefillChunk(0, n, n, torch.empty(0, dtype=torch.int32))])
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        return self.model.compute_logits(self.model(ids, torch.arange(n, device=self.device), ctx), ctx)

    def _counts(self, ordered: list) -> torch.Tensor:
        return torch.tensor([s.num_samples for s in ordered if s.should_sample], device=self.device)

    def _sampling_row(self, seq, sample_index: int) -> SamplingRow:
        key = (seq.request_id, seq.sample_index + sample_index)
        return SamplingRow(seq.sampling_params, self._generator(seq, key), seq.prompt_token_ids,
                           seq.completion_token_ids)

    def _generator(self, seq, key: tuple[str, int]) -> torch.Generator | None:
        params = seq.sampling_params
        if params.is_greedy:
            return None
        if key not in self.generators:
            seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, (), generator=self.seed_rng))
            self.generators[key] = torch.Generator().manual_seed(seed + key[1])
        return self.generators[key]

    def release(self, seq) -> None:
        self.generators.pop((seq.request_id, seq.sample_index), None)
