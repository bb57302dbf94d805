"""A draft model: a smaller model of the target's vocabulary proposes k tokens, one forward each.

It runs on its own `ModelRunner` with its own paged KV cache of as many blocks as the target's, addressed
through the target's block tables (one block table per sequence, two caches), so the block manager, the
prefix cache and the scheduler need nothing of their own for it. `Sequence.num_draft_computed_tokens`
counts the tokens whose draft KV is written; it starts at 0 (a prefix-cache hit is a hit for the target;
the draft recomputes the prompt), lags the target by at most a token after a verify step, and is rolled
back with the blocks.

Per step, for the verify rows the scheduler reserved (k_i drafts each, KV blocks for them included):
round 0 runs each row's uncomputed tokens (its prompt the first time: a prefill chunk, within the step
token budget; a row that cannot catch up this step proposes nothing) and samples draft 1; rounds
1..k - 1 decode one token per row. Greedy rows take the draft's argmax; sampled rows draw from the draft's
processed distribution q (the target's temperature, top-k, top-p) and keep q for the rejection sampler.
One host sync per round (the drafts' ids)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import torch

from ..loader import load_checkpoint
from ..model_runner import ModelRunner
from ..sample import ops
from ..sequence import Sequence


def _layer_of(name: str) -> int:
    """The decoder layer a checkpoint tensor belongs to (Hugging Face names), -1 for the others."""
    found = re.search(r"\.layers\.(\d+)\.", name)
    return int(found.group(1)) if found else -1


@dataclass(slots=True)
class _DraftView:
    """A sequence as the draft runner sees it: the target's tokens plus the drafts so far, the draft's KV
    progress, the target's block table."""

    seq: Sequence
    token_ids: list[int]
    num_computed_tokens: int
    drafts: list[int] = field(default_factory=list)

    def __getattr__(self, name):  # block_table, sampling_params, request_id, ids: the target sequence's
        return getattr(self.seq, name)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(slots=True)
class _DraftRow:
    """One row of a draft forward, shaped like the scheduler's `ScheduledSequence`."""

    seq: _DraftView
    num_new_tokens: int
    should_sample: bool = True
    num_spec_tokens: int = 0
    num_samples: int = 1


class DraftModelProposer:
    def __init__(self, runner: ModelRunner, vocab_size: int) -> None:
        self.runner, self.vocab_size = runner, vocab_size

    @classmethod
    def load(cls, model: str, engine_config, device: torch.device, dtype: torch.dtype,
             target_vocab_size: int, layers: int | None = None) -> DraftModelProposer:
        """The draft's weights on the target's device and dtype (no KV cache yet: see `attach`); `layers`:
        only the first N decoder layers (then the model's final norm and LM head)."""
        keep_q4_1 = device.type == "cpu" and engine_config.cpu_int4_matmul and dtype == torch.float32
        model_config, weights, _ = load_checkpoint(model, dtype, keep_q4_1, engine_config.load_format)
        if layers is not None and layers < model_config.num_layers:
            model_config = replace(model_config, num_layers=layers)
            weights = (w for w in weights if _layer_of(w[0]) < layers) if weights is not None else None
        if model_config.vocab_size != target_vocab_size:
            raise ValueError(f"the draft model {model} has a vocabulary of {model_config.vocab_size} tokens, the "
                             f"target {target_vocab_size}: a draft must share the target's tokenizer")
        draft_config = replace(engine_config, max_loras=0)  # a request's adapter is the target's, not the draft's
        return cls(ModelRunner(draft_config, model_config, weights, device, dtype), target_vocab_size)

    @property
    def block_bytes(self) -> int:
        return self.runner.block_bytes

    def attach(self, num_blocks: int, max_model_len: int) -> None:
        """KV cache of the target's block count; input buffers (and CUDA graphs) for its context."""
        self.runner.allocate_kv_cache(num_blocks * self.runner.block_bytes)
        self.runner.capture_cudagraphs(max_model_len)

    # -- the proposer interface -------------------------------------------------------------------

    def available(self, seq: Sequence, k: int) -> int:
        return k

    def peek(self, seq: Sequence) -> None:
        return None  # a draft costs a forward: nothing to check for free

    def release(self, seq: Sequence) -> None:
        self.runner.release(seq)

    @torch.inference_mode()
    def propose(self, items: list) -> tuple[dict[int, list[int]], dict[int, torch.Tensor] | None]:
        views = [(_DraftView(i.seq, list(i.seq.token_ids), i.seq.num_draft_computed_tokens), i.num_spec_tokens)
                 for i in items]
        budget = self.runner.config.max_num_batched_tokens
        active, batch = [], []
        for view, k in views:
            row, budget = self._catch_up(view, budget)
            if row is not None:
                active.append((view, k))
                batch.append(row)
        greedy = all(v.sampling_params.is_greedy for v, _ in active)
        probs: dict[int, list[torch.Tensor]] = {}
        while batch:
            self._draw(batch, greedy, probs)
            active = [(v, k) for v, k in active if len(v.drafts) < k]
            batch = [_DraftRow(v, 1) for v, _ in active]
        for view, _ in views:
            view.seq.num_draft_computed_tokens = view.num_computed_tokens
        drafts = {v.seq.seq_id: v.drafts for v, _ in views}
        return drafts, None if greedy else {s: torch.stack(p) for s, p in probs.items()}

    def _catch_up(self, view: _DraftView, budget: int) -> tuple[_DraftRow | None, int]:
        """Round 0's row: the tokens the draft has not seen, when they fit what is left of the step's budget
        (else a chunk of them now, proposals from a later step); -> (row or None, budget left)."""
        behind = view.num_tokens - view.num_computed_tokens
        if behind <= budget:
            return _DraftRow(view, behind), budget - behind
        if budget > 0:
            self.runner.execute_model([_DraftRow(view, budget, should_sample=False)])
            view.num_computed_tokens += budget
        return None, 0

    def _draw(self, batch: list[_DraftRow], greedy: bool, probs: dict[int, list[torch.Tensor]]) -> None:
        """One draft forward: each row's next draft (and its distribution for sampled rows)."""
        ordered, logits = self.runner.execute_model(batch)
        if greedy:
            tokens = logits.argmax(dim=-1).tolist()
        else:
            q = self.runner.sampler.probs(logits, self._metadata(ordered))
            noise = ops.exponential_noise(q, None, q.shape[1], self.runner.sampling.generator, [])
            tokens = ops.exponential_race(q, None, noise).tolist()
            for row, q_row in zip(ordered, q, strict=True):
                probs.setdefault(row.seq.seq.seq_id, []).append(q_row)
        for row, token in zip(ordered, tokens, strict=True):
            view = row.seq
            view.num_computed_tokens += row.num_new_tokens
            view.drafts.append(token)
            view.token_ids.append(token)

    def _metadata(self, ordered: list):
        slots = [self.runner.sampling.slot((r.seq.request_id, r.seq.sample_index), r.seq.sampling_params,
                                           [], []) for r in ordered]
        return self.runner.sampling.metadata(slots)
