"""One generated sequence: token ids, KV progress counters and its block table (torch-free).

Speculative decoding adds two counters: `num_spec_tokens`, how many draft tokens the proposer plans to
have verified in the sequence's next decode step (0 = none; the scheduler reserves KV for them), and
`num_draft_computed_tokens`, the tokens whose KV is in a draft model's own cache (same block table);
both are rolled back with the blocks (`BlockManager.truncate`, `free`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import ClassVar

from native_engine.lora.request import LoRARequest
from native_engine.sampling_params import SamplingParams


PLACEHOLDER = -1  # a token id not yet known: the scheduler's stand-in while the step that samples it runs


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass(slots=True, eq=False)
class Sequence:
    counter: ClassVar[Iterator[int]] = itertools.count()

    token_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""  # "" = str(seq_id)
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0  # lower = sooner
    sample_index: int = 0  # which of the request's n samples; forked children get 1..n-1
    block_size: int = 16  # the engine's KV block size (per engine: two engines may differ)
    lora_request: LoRARequest | None = None  # the adapter the request runs through (None: the base model)
    seq_id: int = field(init=False)
    status: SequenceStatus = field(init=False, default=SequenceStatus.WAITING)
    num_prompt_tokens: int = field(init=False)
    num_computed_tokens: int = field(init=False, default=0)  # tokens whose KV is in the cache
    num_cached_tokens: int = field(init=False, default=0)  # prompt tokens served by the prefix cache
    block_table: list[int] = field(init=False, default_factory=list)
    num_spec_tokens: int = field(init=False, default=0)  # draft tokens planned for the next decode step
    num_draft_computed_tokens: int = field(init=False, default=0)  # tokens in the draft model's KV cache
    finish_reason: str | None = field(init=False, default=None)  # "stop" | "length" | "abort"
    stop_reason: int | str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("a sequence needs at least one prompt token")
        self.token_ids = list(self.token_ids)
        self.seq_id = next(Sequence.counter)
        self.request_id = self.request_id or str(self.seq_id)
        self.num_prompt_tokens = len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def is_prefill(self) -> bool:
        return self.num_computed_tokens < len(self.token_ids) - 1

    @property
    def num_blocks(self) -> int:
        return -(-len(self.token_ids) // self.block_size)

    @property
    def last_block_num_tokens(self) -> int:
        return len(self.token_ids) - (self.num_blocks - 1) * self.block_size

    def block(self, i: int) -> list[int]:
        assert 0 <= i < self.num_blocks, f"block {i} out of range for {self.num_blocks} blocks"
        return self.token_ids[i * self.block_size : (i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def fork(self, sample_index: int) -> Sequence:
        """A value copy with a new seq_id; BlockManager.fork must then take references on the blocks."""
        child = Sequence(
            self.token_ids, self.sampling_params, self.request_id, self.arrival_time, self.priority, sample_index,
            self.block_size, self.lora_request,
        )
        child.num_prompt_tokens = self.num_prompt_tokens
        child.status = self.status
        child.num_computed_tokens = self.num_computed_tokens
        child.num_cached_tokens = self.num_cached_tokens
        child.block_table = list(self.block_table)
        return child
