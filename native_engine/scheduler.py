"""Continuous batching with unified steps: decodes and chunked prefills share one token budget (torch-free).

Each step: running sequences first (decodes, then prefill chunks), then waiting ones by (priority, arrival)
until the token budget, max_num_seqs or free blocks run out. Out of blocks -> preempt by recompute.

Scheduling ahead (vLLM's async scheduling, SGLang's overlap scheduler): while a decode-only step N runs on the
device, `schedule_ahead` schedules step N+1 before N's tokens are known. Each sequence that goes on gets a
`PLACEHOLDER` token where N's token will be, so its counters and blocks are what they will be; the model runner
feeds the placeholder from N's sampled ids on the device, and `postprocess` of N writes the real token in its
place. A sequence that N finishes (EOS, a stop token or string, an abort) rides along in N+1 as a ghost: its
row is computed and dropped (`postprocess` skips it). Its ghost row writes one KV slot past its computed tokens,
in a block that is never in the prefix cache (only full computed blocks are hashed), so nothing can read it.

LoRA: a waiting sequence whose adapter would be one more than `max_loras` among the running ones waits (it
is never refused), and so does everything behind it (FCFS).

Speculative decoding: a decode row whose sequence plans `num_spec_tokens` draft tokens is scheduled as a
verify row of 1 + k tokens (its last token and the k drafts, filled in by the proposer after `schedule`),
when the budget, the blocks (never by preempting), max_model_len and max_tokens leave room. `postprocess`
takes the 1..k + 1 tokens the verification kept: the accepted drafts' KV counts as computed, the blocks
past it are freed (`BlockManager.truncate`) and only then are full blocks hashed.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from native_engine.block_manager import BlockManager
from native_engine.sequence import PLACEHOLDER, Sequence, SequenceStatus


class SchedulerConfig(Protocol):  # EngineConfig satisfies it
    max_num_batched_tokens: int
    max_num_seqs: int
    lora_slots: int


@dataclass(slots=True)
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int  # tokens seq.token_ids[num_computed_tokens:] (+ spec_token_ids on a verify row)
    num_spec_tokens: int = 0  # draft tokens to verify: the last num_spec_tokens of the num_new_tokens
    should_sample: bool = field(init=False)  # this chunk reaches the last token -> sample from its logits
    num_samples: int = field(init=False)  # tokens to sample: 0, 1, or n for an n > 1 prompt's first sample
    spec_token_ids: list[int] = field(init=False, default_factory=list)  # set by the proposer
    num_verified_tokens: int = field(init=False, default=0)  # tokens a verify row appended (postprocess)

    def __post_init__(self) -> None:
        seq = self.seq
        self.should_sample = seq.num_computed_tokens + self.num_new_tokens - self.num_spec_tokens == seq.num_tokens
        first = seq.num_completion_tokens == 0
        self.num_samples = (seq.sampling_params.n if first else 1) if self.should_sample else 0

    def token_ids(self) -> list[int]:
        """The tokens this row computes: the uncomputed ones, then the drafts."""
        start = self.seq.num_computed_tokens
        return self.seq.token_ids[start : start + self.num_new_tokens - self.num_spec_tokens] + self.spec_token_ids


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    num_batched_tokens: int = 0
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)  # (src, dst): copy before the forward
    preempted: list[Sequence] = field(default_factory=list)
    forked: list[Sequence] = field(default_factory=list)  # n > 1 children, filled in by Scheduler.postprocess
    advanced: bool = False  # KV progress already counted (by `schedule_ahead` of the next step)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def add(self, item: ScheduledSequence) -> None:
        self.scheduled.append(item)
        self.num_batched_tokens += item.num_new_tokens

    def set_spec_tokens(self, item: ScheduledSequence, token_ids: list[int]) -> None:
        """The proposer's drafts for a verify row: at most the reserved count (fewer shrink the row)."""
        assert len(token_ids) <= item.num_spec_tokens, (len(token_ids), item.num_spec_tokens)
        unused = item.num_spec_tokens - len(token_ids)
        item.num_new_tokens -= unused
        self.num_batched_tokens -= unused
        item.num_spec_tokens, item.spec_token_ids = len(token_ids), list(token_ids)

    def remove(self, seq: Sequence) -> None:
        """Unschedule a preempted seq: give back its tokens and drop copies into its blocks."""
        for i, item in enumerate(self.scheduled):
            if item.seq is seq:
                self.num_batched_tokens -= self.scheduled.pop(i).num_new_tokens
                dst_blocks = set(seq.block_table)
                self.blocks_to_copy = [pair for pair in self.blocks_to_copy if pair[1] not in dst_blocks]
                return


def _priority(seq: Sequence) -> int:
    return seq.priority


def _victim_key(seq: Sequence) -> tuple[int, float, int]:
    return seq.priority, seq.arrival_time, seq.seq_id  # max = lowest priority, newest


def _is_prefill_chunk(seq: Sequence) -> bool:
    return seq.num_uncomputed_tokens > 1


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        eos_token_ids: Iterable[int] = (),
        max_model_len: int | None = None,
    ) -> None:
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
        self.max_loras = getattr(config, "lora_slots", 0)
        self.block_manager = block_manager
        self.eos_token_ids = frozenset(eos_token_ids)
        capacity = block_manager.num_total_blocks * block_manager.block_size
        limit = max_model_len or getattr(config, "max_model_len", None) or capacity
        self.max_model_len = min(limit, capacity)  # the engine passes the model's limit when config has None
        self.waiting: list[Sequence] = []  # sorted by priority; FCFS within a priority, preempted at the front
        self.running: list[Sequence] = []

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        if seq.num_tokens > self.max_model_len:
            raise ValueError(f"prompt has {seq.num_tokens} tokens, more than max_model_len {self.max_model_len}")
        seq.status = SequenceStatus.WAITING
        self.waiting.insert(bisect_right(self.waiting, seq.priority, key=_priority), seq)

    def abort(self, request_id: str) -> list[Sequence]:
        seqs = [s for s in self.waiting + self.running if s.request_id == request_id]
        for seq in seqs:
            self.finish(seq, "abort")
        return seqs

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        """Finish seq now (abort, stop string): free its blocks and drop it from the queues."""
        if seq.is_finished:
            return
        queue = self.running if seq.status is SequenceStatus.RUNNING else self.waiting
        self._mark_finished(seq, reason, stop_reason)
        queue.remove(seq)

    def preempt(self, seq: Sequence, output: SchedulerOutput | None = None) -> None:
        """Recompute-style: free all blocks, back to the front of its priority class in waiting."""
        if output is not None:
            output.remove(seq)
            output.preempted.append(seq)
        self.block_manager.free(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.insert(bisect_left(self.waiting, seq.priority, key=_priority), seq)

    # ---- schedule
    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        self._schedule_running(output)
        if not output.preempted:
            self._schedule_waiting(output)
        return output

    def _budget(self, output: SchedulerOutput) -> int:
        if len(output.scheduled) >= self.max_num_seqs:
            return 0
        return self.max_num_batched_tokens - output.num_batched_tokens

    def _schedule_running(self, output: SchedulerOutput) -> None:
        for seq in sorted(self.running, key=_is_prefill_chunk):  # decodes first, then prefill chunks
            budget = self._budget(output)
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            num_new_tokens = min(seq.num_uncomputed_tokens, budget)
            num_spec = self._num_spec_tokens(seq, budget) if num_new_tokens == 1 else 0
            if self._reserve(seq, num_new_tokens + num_spec, output):
                output.add(ScheduledSequence(seq, num_new_tokens + num_spec, num_spec))

    def _num_spec_tokens(self, seq: Sequence, budget: int) -> int:
        """Draft tokens a decode row can verify: what the proposer planned, cut to the token budget, the
        context window, max_tokens, and the free blocks (speculation never preempts anybody)."""
        k = seq.num_spec_tokens
        if k <= 0:
            return 0
        left = seq.sampling_params.max_tokens - seq.num_completion_tokens
        k = min(k, budget - 1, self.max_model_len - seq.num_tokens - 1, left - 1)
        if k > 0 and not self.block_manager.can_allocate(seq, 1 + k):
            return 0
        return max(k, 0)

    def _reserve(self, seq: Sequence, num_new_tokens: int, output: SchedulerOutput) -> bool:
        """Allocate blocks for seq, preempting the lowest-priority newest running seqs; False if seq itself went."""
        while not self.block_manager.can_allocate(seq, num_new_tokens):
            victim = max(self.running, key=_victim_key)
            self.preempt(victim, output)
            if victim is seq:
                return False
        output.blocks_to_copy += self.block_manager.allocate(seq, num_new_tokens)
        return True

    def _schedule_waiting(self, output: SchedulerOutput) -> None:
        block_manager = self.block_manager
        while self.waiting and len(self.running) < self.max_num_seqs:
            budget = self._budget(output)
            seq = self.waiting[0]
            if not self._lora_fits(seq):
                break  # its adapter waits for a slot: one of the running adapters' requests must end first
            hits = block_manager.get_computed_blocks(seq)
            num_new_tokens = min(seq.num_tokens - len(hits) * block_manager.block_size, budget)
            if num_new_tokens == 0 or not block_manager.can_allocate(seq, num_new_tokens, hits):
                break  # FCFS: nothing overtakes the head of the queue
            block_manager.allocate(seq, num_new_tokens, hits)
            self.waiting.pop(0)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            output.add(ScheduledSequence(seq, num_new_tokens))

    def _lora_fits(self, seq: Sequence) -> bool:
        """At most `max_loras` adapters among the running sequences (the model runner's slots)."""
        if seq.lora_request is None:
            return True
        active = {s.lora_request.lora_name for s in self.running if s.lora_request is not None}
        return seq.lora_request.lora_name in active or len(active) < self.max_loras

    # ---- schedule ahead (see the module docstring)
    def schedule_ahead(self, prev: SchedulerOutput) -> SchedulerOutput | None:
        """Step N+1 while `prev` (step N, decode-only) runs: every running sequence that N does not finish by
        length decodes once more, on a placeholder for N's token. None (nothing changed) when N+1 would not be
        exactly that: something waits, a row is not a plain one-sample decode, blocks could run short."""
        live = [item.seq for item in prev.scheduled if item.seq.status is SequenceStatus.RUNNING]
        if self.waiting or prev.preempted or prev.forked or not live or len(live) != len(self.running):
            return None
        if any(item.num_new_tokens != 1 or item.num_samples != 1 for item in prev.scheduled):
            return None
        go = [seq for seq in live if not self._finishes_by_length(seq)]
        if not go or len(go) > self.max_num_batched_tokens or any(seq.sampling_params.n != 1 for seq in go):
            return None
        if sum(seq.num_tokens % self.block_manager.block_size == 0 for seq in go) > self.block_manager.num_free_blocks:
            return None
        self.advance(prev)
        output = SchedulerOutput()
        for seq in go:
            seq.append_token(PLACEHOLDER)
            output.blocks_to_copy += self.block_manager.allocate(seq, 1)
            output.add(ScheduledSequence(seq, 1))
        return output

    def _finishes_by_length(self, seq: Sequence) -> bool:
        """Whether the next sampled token ends seq by max_tokens or max_model_len (known before it is drawn)."""
        return seq.num_completion_tokens + 1 >= seq.sampling_params.max_tokens or seq.num_tokens + 1 >= self.max_model_len

    # ---- postprocess
    def postprocess(self, output: SchedulerOutput, sampled: dict[int, list[int]]) -> list[Sequence]:
        """Advance KV progress, append sampled tokens (seq_id -> num_samples tokens), fork n > 1; return finished.
        A placeholder left by `schedule_ahead` takes the sampled token instead of a new one."""
        self.advance(output)
        finished: list[Sequence] = []
        for item in output.scheduled:
            seq = item.seq
            if seq.status is not SequenceStatus.RUNNING:  # aborted or finished since schedule(), or a ghost
                continue
            if item.num_spec_tokens:
                finished += self._append_verified(item, sampled[seq.seq_id])
                continue
            if item.should_sample:
                token_ids = sampled[seq.seq_id]
                assert len(token_ids) == item.num_samples, f"seq {seq.seq_id} needs {item.num_samples} tokens"
                finished += self._append_samples(seq, token_ids, output)
        if finished:
            self.running = [s for s in self.running if not s.is_finished]
        return finished

    def advance(self, output: SchedulerOutput) -> None:
        """The scheduled tokens' KV is computed: count it and hash the blocks it filled (once per step)."""
        if output.advanced:
            return
        output.advanced = True
        for item in output.scheduled:
            seq = item.seq
            if seq.status is SequenceStatus.RUNNING:
                seq.num_computed_tokens += item.num_new_tokens - item.num_spec_tokens
                if not item.num_spec_tokens:  # a verify row's blocks are hashed once its rejected drafts are gone
                    self.block_manager.hash_blocks(seq)

    def _append_verified(self, item: ScheduledSequence, token_ids: list[int]) -> list[Sequence]:
        """A verify row's 1..k + 1 tokens: the accepted drafts (their KV is computed), then the target's own
        token; the blocks of rejected drafts are freed before any block is hashed."""
        seq = item.seq
        assert 1 <= len(token_ids) <= item.num_spec_tokens + 1, (len(token_ids), item.num_spec_tokens)
        assert token_ids[:-1] == item.spec_token_ids[: len(token_ids) - 1], "accepted tokens must be the drafts"
        for token_id in token_ids[:-1]:
            seq.append_token(token_id)
            seq.num_computed_tokens += 1
            item.num_verified_tokens += 1
            if self._check_stop(seq):
                return [seq]
        self.block_manager.truncate(seq)
        self.block_manager.hash_blocks(seq)
        seq.append_token(token_ids[-1])
        item.num_verified_tokens += 1
        return [seq] if self._check_stop(seq) else []

    def _append_samples(self, seq: Sequence, token_ids: list[int], output: SchedulerOutput) -> list[Sequence]:
        children = [self._fork(seq, i) for i in range(1, len(token_ids))]
        output.forked += children
        finished = []
        for s, token_id in zip([seq, *children], token_ids):
            if s.token_ids[-1] == PLACEHOLDER:
                s.token_ids[-1] = token_id
            else:
                s.append_token(token_id)
            if self._check_stop(s):
                finished.append(s)
        return finished

    def _fork(self, parent: Sequence, sample_index: int) -> Sequence:
        child = parent.fork(sample_index)
        self.block_manager.fork(parent, child)
        self.running.append(child)
        return child

    def _check_stop(self, seq: Sequence) -> bool:
        params, token_id = seq.sampling_params, seq.last_token
        ends_at_eos = not params.ignore_eos or params.structured_outputs is not None  # a grammar ends at its EOS
        if ends_at_eos and token_id in self.eos_token_ids:
            self._mark_finished(seq, "stop", None)
        elif token_id in params.stop_token_ids:
            self._mark_finished(seq, "stop", token_id)
        elif seq.num_completion_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            self._mark_finished(seq, "length", None)
        return seq.is_finished

    def _mark_finished(self, seq: Sequence, reason: str, stop_reason: int | str | None) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason, seq.stop_reason = reason, stop_reason
