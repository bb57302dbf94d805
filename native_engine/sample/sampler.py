"""Turns the last-position logits of each sampled row into tokens, on the device, for the whole batch.

Order (vLLM v1): the raw log-probabilities for the rows that ask, penalties, grammar bitmasks, then greedy
rows take the argmax and the other rows are divided by their temperature, cut by top-k, top-p and min-p and
drawn together by one exponential race (`ops.exponential_race`). Rows with a seed draw their noise from
their own generator over the whole vocabulary, so a seeded request gives the same tokens alone or in any
batch; the rest share one batched draw from the engine's generator.

Nothing of size [S, V] leaves the device: `SamplerOutput.start_copy` starts one copy of the sampled ids (and
of the asked logprobs, packed into the same float64 tensor) into pinned memory without waiting, and
`HostTokens.wait` waits for that copy alone (a CUDA event), not for whatever the device was given since.

For speculative decoding, `Sampler.probs` gives the same processed distribution as a [S, V] tensor on the
device (greedy rows one-hot), so a verifier can compare target and draft probabilities for k + 1 positions
per row laid out as k + 1 rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..kernels.sampling import MAX_CANDIDATES, fused_sampling, sample_candidates_triton
from . import ops
from .metadata import SamplingMetadata


@dataclass(slots=True)
class SampledToken:
    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class HostTokens:
    """A step's sampled ids on their way to the host: `wait` returns them once the copy has landed."""

    host: torch.Tensor  # int64 [S], or float64 [S, 2 + 2k] with logprobs (see SamplerOutput._packed)
    event: torch.cuda.Event | None = None
    logprob_rows: list[int] = field(default_factory=list)
    num_logprobs: int = 0

    def wait(self) -> list[SampledToken]:
        if self.event is not None:
            self.event.synchronize()
        host = self.host.tolist()
        if self.host.dim() == 1:
            return [SampledToken(t) for t in host]
        out = [SampledToken(int(r[0])) for r in host]
        k = self.num_logprobs
        for i in self.logprob_rows:
            r = host[i]
            out[i].logprob = r[1]
            out[i].top_logprobs = [(int(t), v) for t, v in zip(r[2 : 2 + k], r[2 + k :], strict=True)]
        return out


@dataclass(slots=True)
class SamplerOutput:
    token_ids: torch.Tensor  # [S] int64, on the device
    logprobs: torch.Tensor | None = None  # [L, 1 + 2k] float64 (see ops.gather_logprobs)
    logprob_rows: list[int] = field(default_factory=list)
    num_logprobs: int = 0
    logprob_index: torch.Tensor | None = None  # logprob_rows on the device

    def _packed(self) -> torch.Tensor:
        """The ids alone, or [S, 2 + 2k] float64: the id, then the row's logprobs when it asked (float64 holds
        the ids exactly)."""
        if self.logprobs is None:
            return self.token_ids
        rows = self.logprob_index
        if rows is None:
            rows = torch.as_tensor(self.logprob_rows, device=self.token_ids.device)
        packed = torch.zeros(len(self.token_ids), self.logprobs.shape[1] + 1, dtype=torch.float64,
                             device=self.token_ids.device)
        packed[:, 0] = self.token_ids
        packed[rows, 1:] = self.logprobs
        return packed

    def start_copy(self) -> HostTokens:
        """The step's one device-to-host copy, started without waiting: into pinned memory and followed by an
        event on CUDA (torch's pinned-memory cache keeps the buffer until the copy is done); on CPU no copy."""
        packed = self._packed()
        event = None
        if packed.is_cuda:
            host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            host.copy_(packed, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            host = packed
        return HostTokens(host, event, self.logprob_rows, self.num_logprobs)

    def to_host(self) -> list[SampledToken]:
        """The sampled tokens on the host (waits for the copy)."""
        return self.start_copy().wait()


class Sampler:
    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        # logits: [S, V], one row per sampled sequence
        assert logits.dim() == 2 and logits.shape[0] == meta.num_rows, (logits.shape, meta.num_rows)
        logits = logits.float()
        raw = logits.index_select(0, meta.logprob_rows) if meta.logprob_rows is not None else None
        logits = self.processed_logits(logits, meta)
        token_ids = self._sample(logits, meta)
        if raw is None:
            return SamplerOutput(token_ids)
        lp = ops.gather_logprobs(raw, token_ids.index_select(0, meta.logprob_rows), meta.max_num_logprobs)
        return SamplerOutput(token_ids, lp, meta.logprob_row_list, meta.max_num_logprobs, meta.logprob_rows)

    @staticmethod
    def processed_logits(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Penalties, then grammar masks (in place: the logits are this step's own tensor)."""
        logits = ops.apply_penalties(logits, meta.seen, meta.output_counts, meta.repetition_penalty,
                                     meta.presence_penalty, meta.frequency_penalty)
        if meta.grammar_bitmask is not None:
            ops.apply_token_bitmask(logits, meta.grammar_rows, meta.grammar_bitmask)
        return logits

    def _sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        greedy = None if meta.all_random else logits.argmax(dim=-1)
        if meta.all_greedy:
            return greedy
        drawn = self._fused_draw(logits, meta)
        if drawn is None:
            probs, ids = self._filtered(logits, meta)
            q = ops.exponential_noise(probs, ids, logits.shape[1], meta.generator, meta.seeded)
            drawn = ops.exponential_race(probs, ids, q)
        return drawn if greedy is None else torch.where(meta.greedy, greedy, drawn)

    @staticmethod
    def _fused_draw(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor | None:
        """On CUDA, when a top-k bounds every random row (Ollama's default top_k 40): the top-k, the same
        noise as the unfused path, and one kernel for the rest (kernels/sampling.py). None: the unfused ops."""
        k = meta.max_top_k
        if not fused_sampling(logits) or not 0 < k < min(logits.shape[1], MAX_CANDIDATES + 1):
            return None
        values, ids = logits.topk(k, dim=-1)
        q = ops.exponential_noise(values, ids, logits.shape[1], meta.generator, meta.seeded, clamp=False)
        return sample_candidates_triton(values, ids, q, meta.temperature, meta.top_k, meta.top_p, meta.min_p)

    @staticmethod
    def _filtered(logits: torch.Tensor, meta: SamplingMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        return ops.top_k_top_p(logits, meta.temperature, meta.top_k, meta.max_top_k, meta.top_p, meta.min_p,
                               meta.greedy)

    def probs(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """The distribution the rows are drawn from, [S, V] float32 on the device (greedy rows: one-hot)."""
        logits = self.processed_logits(logits.float(), meta)
        vocab = logits.shape[1]
        one_hot = torch.zeros_like(logits).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        if meta.all_greedy:
            return one_hot
        probs = ops.full_probs(*self._filtered(logits, meta), vocab)
        return probs if meta.all_random else torch.where(meta.greedy[:, None], one_hot, probs)
