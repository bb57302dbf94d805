"""Per-sequence sampling state, kept across steps in one row ("slot") per live sequence.

vLLM v1's persistent batch in a small form: a sequence gets a slot the first time it samples and keeps
it until `release` (finish or abort; a preempted sequence keeps its slot, its counts stay right). A slot
holds the request's parameters (a float32 row of the host table), its seeded generator, and, for the
requests with penalties, two device rows of the vocabulary's size: `seen` (prompt and output tokens, for
the repetition penalty) and `counts` (output tokens, for presence and frequency). Those are filled once
from the prompt and then updated in place from the sampled ids on the device (`update`), so a step never
rebuilds a token set. The penalty tensors are allocated on the first request that needs them.

Each step, `metadata` gathers the rows of the step's slots on the host (numpy), makes one copy to the
device (pinned staging on CUDA) and derives the flags that let the sampler skip whatever no row uses. A step
with the same slots as the one before, none set up or released since (a run of decode steps), reuses that
metadata, parameters already on the device, and only gathers the penalty rows again.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ..platform import to_device
from ..sampling_params import SamplingParams
from .metadata import SamplingMetadata

TEMP, TOP_K, TOP_P, MIN_P, REP, PRES, FREQ, GREEDY, SEEDED, LOGPROBS, SLOT = range(11)
NUM_COLUMNS = 11


def has_penalties(params: SamplingParams) -> bool:
    return params.repetition_penalty != 1.0 or bool(params.presence_penalty) or bool(params.frequency_penalty)


class SamplingState:
    def __init__(self, vocab_size: int, max_num_seqs: int, device: torch.device, seed: int = 0) -> None:
        self.vocab_size, self.device = vocab_size, device
        self.slots: dict[tuple[str, int], int] = {}
        self.generators: dict[int, torch.Generator] = {}  # slot -> generator, seeded rows only
        self.generator = torch.Generator(device=device).manual_seed(seed)  # every unseeded row's draws
        self.seen: torch.Tensor | None = None  # [capacity, V] bool
        self.counts: torch.Tensor | None = None  # [capacity, V] int32
        self._version = 0  # bumped whenever a slot's row changes: the key of the cached metadata
        self._cached: tuple[tuple, SamplingMetadata] | None = None
        self._resize(max(1, max_num_seqs))

    @property
    def capacity(self) -> int:
        return self.table.shape[0]

    def _resize(self, capacity: int) -> None:
        old = getattr(self, "table", np.zeros((0, NUM_COLUMNS), np.float32))
        self.table = np.zeros((capacity, NUM_COLUMNS), np.float32)
        self.table[: len(old)] = old
        self.free = list(range(capacity - 1, len(old) - 1, -1)) + getattr(self, "free", [])
        pinned = self.device.type == "cuda"
        # two pinned buffers used in turn: a step scheduled ahead must not overwrite the one whose copy may be
        # pending (see input_batch.py)
        self.staging = [torch.zeros(capacity, NUM_COLUMNS, dtype=torch.float32, pin_memory=pinned) for _ in range(2)]
        self._turn = 0
        if self.seen is not None:
            grow = capacity - self.seen.shape[0]
            self.seen = torch.cat([self.seen, self.seen.new_zeros(grow, self.vocab_size)])
            self.counts = torch.cat([self.counts, self.counts.new_zeros(grow, self.vocab_size)])

    # -- slots --------------------------------------------------------------------------------

    def slot(self, key: tuple[str, int], params: SamplingParams, prompt: list[int], output: list[int]) -> int:
        """The slot of sequence `key` = (request id, sample index), set up on first use."""
        slot = self.slots.get(key)
        if slot is None:
            slot = self._allocate(key, params)
            if has_penalties(params):
                self._init_penalties(slot, prompt, output)
        return slot

    def _allocate(self, key: tuple[str, int], params: SamplingParams) -> int:
        if not self.free:
            self._resize(2 * self.capacity)
        slot = self.free.pop()
        self.slots[key] = slot
        self._version += 1
        greedy = params.is_greedy
        top_k = params.top_k if 0 < params.top_k < self.vocab_size else self.vocab_size
        self.table[slot] = (1.0 if greedy else params.temperature, top_k, params.top_p, params.min_p,
                            params.repetition_penalty, params.presence_penalty, params.frequency_penalty,
                            greedy, params.seed is not None and not greedy,
                            -1 if params.logprobs is None else params.logprobs, slot)
        if params.seed is not None and not greedy:
            self.generators[slot] = torch.Generator(device=self.device).manual_seed(params.seed + key[1])
        return slot

    def _init_penalties(self, slot: int, prompt: list[int], output: list[int]) -> None:
        if self.seen is None:
            shape = (self.capacity, self.vocab_size)
            self.seen = torch.zeros(shape, dtype=torch.bool, device=self.device)
            self.counts = torch.zeros(shape, dtype=torch.int32, device=self.device)
        self.seen[slot].zero_()
        self.counts[slot].zero_()
        self.seen[slot, to_device(prompt + output, torch.long, self.device)] = True
        if output:
            out = to_device(output, torch.long, self.device)
            self.counts[slot].index_add_(0, out, torch.ones_like(out, dtype=torch.int32))

    def release(self, key: tuple[str, int]) -> None:
        slot = self.slots.pop(key, None)
        if slot is not None:
            self.generators.pop(slot, None)
            self.free.append(slot)
            self._version += 1

    # -- one step -----------------------------------------------------------------------------

    def metadata(self, slots: list[int]) -> SamplingMetadata:
        key = (tuple(slots), self._version)
        if self._cached is not None and self._cached[0] == key:
            meta = replace(self._cached[1])  # a copy: the model runner sets the step's grammar fields on it
            if meta.seen is not None:
                self._penalty_fields(meta, self.table[np.asarray(slots, dtype=np.int64)], None)
            return meta
        meta = self._metadata(slots)
        self._cached = (key, meta)
        return replace(meta)

    def _metadata(self, slots: list[int]) -> SamplingMetadata:
        rows = self.table[np.asarray(slots, dtype=np.int64)]  # [S, NUM_COLUMNS] on the host
        greedy = rows[:, GREEDY] > 0
        penalties = self.seen is not None and bool(
            (rows[:, REP] != 1.0).any() or (rows[:, PRES] != 0.0).any() or (rows[:, FREQ] != 0.0).any())
        if greedy.all() and not penalties:  # the common fast path: one argmax, nothing to send
            meta = SamplingMetadata(len(slots), None, all_greedy=True, all_random=False)
            self._logprob_fields(meta, rows)
            return meta
        dev = self._to_device(rows)
        meta = SamplingMetadata(len(slots), dev[:, SLOT].long(), all_greedy=bool(greedy.all()),
                                all_random=not greedy.any(), generator=self.generator)
        if not meta.all_greedy:
            self._random_fields(meta, rows, dev, ~greedy)
        if not (meta.all_greedy or meta.all_random):
            meta.greedy = dev[:, GREEDY] > 0
        if penalties:
            self._penalty_fields(meta, rows, dev)
        self._logprob_fields(meta, rows)
        return meta

    def _logprob_fields(self, meta: SamplingMetadata, rows: np.ndarray) -> None:
        asked = np.flatnonzero(rows[:, LOGPROBS] >= 0)
        if len(asked):
            meta.logprob_row_list = asked.tolist()
            meta.logprob_rows = torch.from_numpy(asked).to(self.device, non_blocking=True)
            meta.max_num_logprobs = int(rows[asked, LOGPROBS].max())

    def _to_device(self, rows: np.ndarray) -> torch.Tensor:
        if self.device.type == "cpu":
            return torch.from_numpy(rows)
        self._turn ^= 1
        host = self.staging[self._turn][: len(rows)]
        host.numpy()[:] = rows
        return host.to(self.device, non_blocking=True)

    def _random_fields(self, meta: SamplingMetadata, rows: np.ndarray, dev: torch.Tensor, random: np.ndarray) -> None:
        meta.temperature = dev[:, TEMP]
        top_k = rows[random, TOP_K]
        meta.max_top_k = int(top_k.max())
        if (top_k != meta.max_top_k).any():
            meta.top_k = dev[:, TOP_K].long()
        if (rows[random, TOP_P] < 1.0).any():
            meta.top_p = dev[:, TOP_P]
        if (rows[random, MIN_P] > 0.0).any():
            meta.min_p = dev[:, MIN_P]
        seeded = np.flatnonzero(random & (rows[:, SEEDED] > 0))
        meta.seeded = [(int(i), self.generators[int(rows[i, SLOT])]) for i in seeded]

    def _penalty_fields(self, meta: SamplingMetadata, rows: np.ndarray, dev: torch.Tensor | None) -> None:
        """The penalties' parameters (`dev`; None: already set) and this step's rows of the token sets."""
        repetition = (rows[:, REP] != 1.0).any()
        counted = (rows[:, PRES] != 0.0).any() or (rows[:, FREQ] != 0.0).any()
        if repetition and dev is not None:
            meta.repetition_penalty = dev[:, REP]
        if counted:
            if dev is not None:
                meta.presence_penalty, meta.frequency_penalty = dev[:, PRES], dev[:, FREQ]
            meta.output_counts = self.counts.index_select(0, meta.slots)
        if repetition or counted:
            meta.seen = self.seen.index_select(0, meta.slots)

    def update(self, meta: SamplingMetadata, token_ids: torch.Tensor) -> None:
        """Count the sampled tokens (on the device, in place) for the rows that use penalties. The counts only
        when a row of the step uses them (presence, frequency): a slot's parameters never change, so the counts
        of slots that never read them may go stale (an accumulating index_put is a sort on CUDA)."""
        if meta.seen is None and meta.output_counts is None:
            return
        self.seen.index_put_((meta.slots, token_ids), torch.ones_like(token_ids, dtype=torch.bool))
        if meta.output_counts is not None:
            self.counts.index_put_((meta.slots, token_ids), torch.ones_like(token_ids, dtype=torch.int32),
                                   accumulate=True)
