"""Builds the model, owns the paged KV cache, turns scheduled sequences into tensors, runs
the forward pass and samples.

A step is `launch` (inputs, forward, sampler, the sampled ids' copy to the host started) then `collect`
(wait for that copy); `run` does both. Between them the engine may launch the next step (scheduled ahead):
its placeholder input ids are then taken on the device from this step's sampled ids (`_placeholder_ids`).

In a tensor-parallel group (`tp`) every rank has a runner with its shard of the model and its own KV
cache (its KV heads, the same blocks); rank 0's `run` broadcasts the step's plan (`send_step`) and samples,
the other ranks `execute` the plans they receive (`distributed/worker.py`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from . import platform
from .config import EngineConfig
from .cuda_graph import DecodeGraphs, MixedGraphs
from .kernels import triton_available
from .layers.attention import Attention
from .layers.embed_head import LMHead, VocabEmbedding
from .layers.linear import finish_loading, use_small_batch_weights
from .distributed.parallel_state import Kind
from .input_batch import InputBuffers, StepPlan
from .sample import HostTokens, SampledToken, Sampler, SamplingMetadata, SamplingState
from .sequence import PLACEHOLDER
from .structured_output import StructuredOutputManager
from .models import model_class
from .spec_decode.rejection_sampler import RejectionSampler, VerifyRows
from .forward_context import Context, PrefillChunk
from .lora.manager import LoRAManager
from .lora.punica import LoRAMapping
from .loader.weights import dummy_weights, load_weights


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


def bytes_per_token(model_config, dtype: torch.dtype, num_kv_heads: int | None = None) -> int:
    """KV bytes per token: 2 (K and V) x layers x kv heads (a rank's, when given) x head dim x dtype bytes."""
    element = torch.empty((), dtype=dtype).element_size()
    heads = model_config.num_kv_heads if num_kv_heads is None else num_kv_heads
    return 2 * model_config.num_layers * heads * model_config.head_dim * element


def decode_first(scheduled: list, lora_slots: dict[str, int] | None = None) -> list:
    """The batch layout `Attention` expects: decode rows (one token, or a verify row's 1 + k), then prefill
    chunks; within each, the rows of the LoRA adapters by slot (one run per adapter, lora/punica.py)."""
    if not lora_slots:
        return sorted(scheduled, key=lambda s: s.num_new_tokens - s.num_spec_tokens > 1)
    return sorted(scheduled, key=lambda s: (s.num_new_tokens - s.num_spec_tokens > 1, _slot(s.seq, lora_slots)))


def _slot(seq, lora_slots: dict[str, int]) -> int:
    return -1 if seq.lora_request is None else lora_slots[seq.lora_request.lora_name]


@dataclass(slots=True)
class LaunchedStep:
    """A step on the device: its sampled rows (sequence, sample offset) and their ids, on the device and on
    their way to the host."""

    rows: list = field(default_factory=list)
    keys: list[tuple[str, int]] = field(default_factory=list)
    token_ids: torch.Tensor | None = None  # [S] int64 on the device
    host: HostTokens | None = None
    tokens: dict[int, list[SampledToken]] | None = None  # a verify step's tokens, already on the host


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config, weights: Iterable, device: torch.device,
                 dtype: torch.dtype, tp=None) -> None:
        self.config, self.model_config, self.device, self.dtype = config, model_config, device, dtype
        self.tp = tp  # TensorParallelGroup, None alone
        with torch.device(device), _default_dtype(dtype):
            self.model = model_class(model_config.architecture)(model_config, tp)
        if weights is None:
            dummy_weights(self.model, config.seed)
        else:
            load_weights(self.model, weights)
        self.model.eval()
        self.extra_weight_bytes = 0
        if device.type == "cpu" and dtype == torch.bfloat16 and config.cpu_fp16_small_batch:
            self.extra_weight_bytes = use_small_batch_weights(self.model)
        self.int4_weight_bytes = self._finish_loading(device.type == "cpu" and dtype == torch.float32
                                                      and config.cpu_int4_matmul)
        if config.cpu_bf16_prefill and device.type == "cpu" and dtype == torch.float32 and tp is None:
            self.extra_weight_bytes += getattr(self.model.model, "use_bf16_prefill", lambda: 0)()
        slots = config.lora_slots
        self.lora = (LoRAManager(self.model, model_config, slots, device, dtype, config.max_lora_rank)
                     if slots else None)
        self.num_kv_heads = self.model.shard.kv_heads.size  # this rank's
        self.block_bytes = config.block_size * bytes_per_token(model_config, dtype, self.num_kv_heads)
        self.num_kvcache_blocks = 0
        self.kv_cache = torch.empty(0)
        self.sampler = Sampler()
        self.rejection_sampler = RejectionSampler(self.sampler)
        self.max_spec_tokens = 0  # set by the engine when it speculates (sizes the input buffers)
        self.sampling = SamplingState(model_config.vocab_size, config.max_num_seqs, device, config.seed)
        self.structured: StructuredOutputManager | None = None  # set by the engine, which has the tokenizer
        self.graphs: DecodeGraphs | None = None
        self.mixed_graphs: MixedGraphs | None = None  # steps with prefill chunks (with unified_attention)
        self.inputs: InputBuffers | None = None  # allocated by `size_inputs` once max_model_len is known

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
        """One tensor [2, layers, blocks, block_size, kv_heads, head_dim]; each layer gets its K and V views.
        In a group every rank gets the blocks the tightest rank can hold (one block table for all)."""
        mc = self.model_config
        self.num_kvcache_blocks = max(num_bytes // self.block_bytes, 0)
        if self.tp is not None:
            self.num_kvcache_blocks = self.tp.min_int(self.num_kvcache_blocks)
        shape = (2, mc.num_layers, self.num_kvcache_blocks, self.config.block_size, self.num_kv_heads, mc.head_dim)
        self.kv_cache = _zeros(shape, self.dtype, self.device)
        layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        for i, attn in enumerate(layers):
            attn.k_cache, attn.v_cache = self.kv_cache[0, i], self.kv_cache[1, i]
        if (self.device.type == "cpu" and self.tp is None and hasattr(self.model, "model")
                and hasattr(self.model.model, "use_cpu_decode")):
            self.model.model.use_cpu_decode(getattr(self.model, "lm_head", None))  # decode steps in one C call
        if self.config.fused_decode and hasattr(self.model, "model") and hasattr(self.model.model, "use_fused_decode"):
            self.model.model.use_fused_decode(self.device)  # only where every layer can: never sharded ones
        return self.num_kvcache_blocks

    def size_inputs(self, max_model_len: int) -> None:
        """The step's input buffers, sized for the longest sequence (allocated once)."""
        max_blocks = -(-max_model_len // self.config.block_size)
        self.inputs = InputBuffers(max(self.config.max_num_batched_tokens, self.config.max_num_seqs),
                                   self.config.max_num_seqs, max_blocks, self.config.block_size, self.device,
                                   self.max_spec_tokens, self._unified_attention())

    def _unified_attention(self) -> bool:
        """Mixed steps through the unified kernel: asked for, on CUDA, with Triton to compile it (its torch
        reference syncs with the host, which a CUDA graph cannot capture)."""
        return self.config.unified_attention and self.device.type == "cuda" and triton_available()

    def capture_cudagraphs(self, max_model_len: int) -> None:
        """CUDA graphs for decode batches up to `max_num_seqs` (GPU only; `enforce_eager` turns them off)."""
        self.size_inputs(max_model_len)
        if self.device.type != "cuda" or self.config.enforce_eager:
            return
        max_blocks = -(-max_model_len // self.config.block_size)
        self.graphs = DecodeGraphs(self.model, min(self.config.max_num_seqs, 512), max_blocks,
                                   self.model_config.hidden_size, self.device, self.dtype)
        if self.inputs.unified:  # the unified kernel makes a mixed step's forward capturable
            self.mixed_graphs = MixedGraphs(self.model, self.inputs.max_tokens, self.config.max_num_seqs, max_blocks,
                                            self.model_config.hidden_size, self.device, self.dtype)

    def profile_run(self) -> None:
        """A forward over the step token budget without the cache: the activation peak for KV sizing."""
        n = min(self.config.max_num_batched_tokens, self.model_config.max_position_embeddings)
        self._score([0] * n)  # every rank of a group runs it at the same point of its start

    def weight_bytes(self) -> int:
        """Bytes of the weights as computed with: dense parameters plus int4 packed ones."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters()) + self.int4_weight_bytes

    # -- execution ----------------------------------------------------------------------------

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        for src, dst in pairs:
            self.kv_cache[:, :, dst].copy_(self.kv_cache[:, :, src])

    def _graph_bucket(self, ordered: list) -> int | None:
        if self.graphs is None or any(s.num_new_tokens - s.num_spec_tokens != 1 or not s.should_sample
                                      or s.seq.lora_request is not None for s in ordered):
            return None
        num_queries = sum(s.num_new_tokens for s in ordered)  # a verify row's tokens are decode queries
        return self.graphs.bucket(num_queries, max(len(s.seq.block_table) for s in ordered))

    def run(self, scheduled: list, blocks_to_copy: list[tuple[int, int]] = (),
            draft_probs: dict[int, torch.Tensor] | None = None) -> dict[int, list[SampledToken]]:
        """Forward the scheduled chunks; returns `num_samples` tokens for each sequence that samples, and
        1..k + 1 for each verify row (its accepted drafts and one token of the target's).
        draft_probs: seq_id -> [k, V], a draft model's distributions of its drafts (None: point masses)."""
        return self.collect(self.launch(scheduled, blocks_to_copy, draft_probs=draft_probs))

    @torch.inference_mode()
    def launch(self, scheduled: list, blocks_to_copy: list[tuple[int, int]] = (),
               prev: LaunchedStep | None = None, draft_probs: dict[int, torch.Tensor] | None = None
               ) -> LaunchedStep:
        """Everything of a step up to the sampled ids' copy to the host, without waiting for the device.
        `prev`: the step still running whose sampled ids this one's placeholder tokens are. A step with
        verify rows is verified at once (the rejection sampler's tokens are on the host when it returns)."""
        ordered, logits = self.execute_model(scheduled, blocks_to_copy, prev)
        if logits is None:
            return LaunchedStep()
        if not any(s.num_spec_tokens for s in ordered):
            return self.sample_tokens(ordered, logits)
        return LaunchedStep(tokens=self._sample_and_verify(ordered, logits, draft_probs or {}))

    def execute_model(self, scheduled: list, blocks_to_copy: list[tuple[int, int]] = (),
                      prev: LaunchedStep | None = None) -> tuple[list, torch.Tensor | None]:
        """The forward: (the rows in batch order, the logits of their sampled positions, or None). In a
        tensor-parallel group the plan goes to the other ranks first."""
        lora_slots = self.lora.activate(scheduled) if self.lora is not None else {}
        ordered = decode_first(scheduled, lora_slots)
        plan = self.inputs.plan(ordered, self._graph_bucket(ordered))
        if self.tp is not None:
            self.send_step(plan, blocks_to_copy)
        placeholders = None if prev is None else self._placeholder_ids(ordered, prev)
        lora = self.lora.mapping(ordered, lora_slots) if lora_slots else None
        return ordered, self.execute(plan, blocks_to_copy, placeholders, lora)  # launched; host work overlaps it on GPU

    def sample_tokens(self, ordered: list, logits: torch.Tensor) -> LaunchedStep:
        rows = [(s.seq, i) for s in ordered if s.should_sample for i in range(s.num_samples)]
        if not rows:
            return LaunchedStep()
        keys = [(seq.request_id, seq.sample_index + i) for seq, i in rows]
        meta = self._sampling_metadata(keys, rows)
        if len(rows) > len(logits):  # n > 1: a prompt's first token, n rows from one row of logits
            logits = logits.repeat_interleave(self._counts(ordered), dim=0, output_size=len(rows))  # no sync
        out = self.sampler(logits, meta)
        self.sampling.update(meta, out.token_ids)
        return LaunchedStep(rows, keys, out.token_ids, out.start_copy())  # the step's one device-to-host copy

    def collect(self, launched: LaunchedStep) -> dict[int, list[SampledToken]]:
        """Wait for a launched step's sampled ids; seq_id -> its tokens."""
        if launched.tokens is not None:
            return launched.tokens
        if launched.host is None:
            return {}
        sampled = launched.host.wait()
        self._accept_grammar(launched.keys, launched.rows, sampled)
        tokens: dict[int, list[SampledToken]] = {}
        for (seq, _), token in zip(launched.rows, sampled, strict=True):
            tokens.setdefault(seq.seq_id, []).append(token)
        return tokens

    def _placeholder_ids(self, ordered: list, prev: LaunchedStep) -> torch.Tensor:
        """A step scheduled ahead: each row decodes the token `prev` samples for it, still on the device."""
        where = {seq.seq_id: i for i, (seq, _) in enumerate(prev.rows)}
        assert all(s.num_new_tokens == 1 and s.seq.token_ids[-1] == PLACEHOLDER for s in ordered), "not a step ahead"
        src = [where[s.seq.seq_id] for s in ordered]
        if src == list(range(len(src))):
            return prev.token_ids[: len(src)]
        return prev.token_ids.index_select(0, platform.to_device(src, torch.long, self.device))

    def _sample_and_verify(self, ordered: list, logits: torch.Tensor, draft_probs: dict[int, torch.Tensor]
                           ) -> dict[int, list[SampledToken]]:
        """Plain rows through the sampler, verify rows (their k + 1 positions each) through the rejection
        sampler; each gets its own slice of the logits."""
        plain, verify, plain_at, verify_at, at = [], [], [], [], 0
        for s in (s for s in ordered if s.should_sample):
            width = s.num_spec_tokens + 1
            (verify if s.num_spec_tokens else plain).append(s)
            (verify_at if s.num_spec_tokens else plain_at).extend(range(at, at + width))
            at += width
        tokens = self.collect(self.sample_tokens(plain, logits[plain_at])) if plain else {}
        rows = VerifyRows.build([s.spec_token_ids for s in verify])
        slots = [self.sampling.slot((s.seq.request_id, s.seq.sample_index), s.seq.sampling_params,
                                    s.seq.prompt_token_ids, s.seq.completion_token_ids)
                 for s in verify for _ in range(s.num_spec_tokens + 1)]
        probs = [draft_probs[s.seq.seq_id] for s in verify] if draft_probs else None
        out = self.rejection_sampler(logits[verify_at], self.sampling.metadata(slots), rows,
                                     None if probs is None else torch.cat(probs), self.sampling.generator)
        for s, ids in zip(verify, out, strict=True):
            tokens[s.seq.seq_id] = [SampledToken(t) for t in ids]
        return tokens

    def send_step(self, plan: StepPlan, blocks_to_copy) -> None:
        """Rank 0 of a group: the step's plan to the other ranks, in one message."""
        copies = np.asarray(list(blocks_to_copy), np.int64).reshape(-1)
        self.tp.send_plan(Kind.RUN, np.concatenate([[len(copies) // 2], copies, plan.to_array()]))

    @staticmethod
    def step_from(payload: np.ndarray) -> tuple[StepPlan, list[tuple[int, int]]]:
        num_copies = int(payload[0])
        pairs = payload[1 : 1 + 2 * num_copies].reshape(-1, 2).tolist()
        return StepPlan.from_array(payload[1 + 2 * num_copies :]), [tuple(p) for p in pairs]

    @torch.inference_mode()
    def execute(self, plan: StepPlan, blocks_to_copy=(), placeholders: torch.Tensor | None = None,
                lora: LoRAMapping | None = None) -> torch.Tensor | None:
        """Every rank's share of a step: block copies, inputs, forward, logits of the sampled rows (rank 0:
        the whole vocabulary's; the other ranks: None; no rank computes them when no row samples).
        `placeholders`: the first input ids, still on the device (a step scheduled ahead; never in a group).
        `lora`: the step's rows per adapter slot (`LoRAManager.mapping`), None when no row has one."""
        self.copy_blocks(list(blocks_to_copy))
        step = self.inputs.build(plan, None if plan.graph_bs is None else self.graphs.inputs)
        step.ctx.lora = lora
        if placeholders is not None:
            step.input_ids[: len(placeholders)].copy_(placeholders)
        if step.graph_bs is not None:
            hidden = self.graphs.run(step.graph_bs, step.ctx)
        elif (bucket := self._mixed_bucket(step)) is not None:
            hidden = self.mixed_graphs.run(bucket, step.input_ids, step.positions, step.ctx)
        elif lora is not None:
            with self.lora.step(lora):
                hidden = self.model(step.input_ids, step.positions, step.ctx)
        else:
            hidden = self.model(step.input_ids, step.positions, step.ctx)
        if not plan.sampled.any():
            return None
        return self.model.compute_logits(hidden, step.ctx)

    def _mixed_bucket(self, step) -> int | None:
        """The mixed-step graph that runs this step, if any: one through the unified kernel that fits a bucket."""
        if self.mixed_graphs is None or step.ctx.query_start is None or step.ctx.lora is not None:
            return None
        return self.mixed_graphs.bucket(len(step.input_ids), *step.ctx.row_tables.shape)

    def _sampling_metadata(self, keys: list[tuple[str, int]], rows: list) -> SamplingMetadata:
        known = self.sampling.slots  # a slot is set up once; its prompt and output are needed only then
        slots = [known[key] if key in known else
                 self.sampling.slot(key, seq.sampling_params, seq.prompt_token_ids, seq.completion_token_ids)
                 for key, (seq, _) in zip(keys, rows, strict=True)]
        meta = self.sampling.metadata(slots)
        if self.structured is not None and any(seq.sampling_params.structured_outputs for seq, _ in rows):
            masks = self.structured.bitmask([(key, seq.sampling_params) for key, (seq, _) in zip(keys, rows)])
            if masks is not None:
                meta.grammar_rows, meta.grammar_bitmask = masks
        return meta

    def _accept_grammar(self, keys: list, rows: list, sampled: list[SampledToken]) -> None:
        if self.structured is not None and self.structured.matchers:
            pairs = [(key, seq.sampling_params) for key, (seq, _) in zip(keys, rows, strict=True)]
            self.structured.accept(pairs, [t.token_id for t in sampled])

    def score(self, token_ids: list[int]) -> torch.Tensor:
        """Logits at every position of one prompt ([n, V] float32), computed without the KV cache."""
        if self.tp is not None:
            self.tp.send_plan(Kind.SCORE, np.asarray(token_ids, np.int64))
        return self._score(token_ids)

    @torch.inference_mode()
    def _score(self, token_ids: list[int]) -> torch.Tensor | None:
        n = len(token_ids)
        ctx = Context(prefills=[PrefillChunk(0, n, n, torch.empty(0, dtype=torch.int32))])
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        return self.model.compute_logits(self.model(ids, torch.arange(n, device=self.device), ctx), ctx)

    def _counts(self, ordered: list) -> torch.Tensor:
        return platform.to_device([s.num_samples for s in ordered if s.should_sample], torch.long, self.device)

    def release(self, seq) -> None:
        key = (seq.request_id, seq.sample_index)
        self.sampling.release(key)
        if self.structured is not None:
            self.structured.release(key)
