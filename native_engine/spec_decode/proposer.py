"""What a proposer is (torch-free interface).

A proposer guesses the next tokens of decode rows; the target verifies them in its next forward. Two
phases, because a draft model needs the step's KV blocks before it can run:

- `available(seq)` before scheduling: how many drafts it could give this sequence now (n-gram: the length
  of its match, computed here; a draft model: k). The adaptive controller turns these into each
  sequence's `num_spec_tokens`, for which the scheduler reserves KV.
- `propose(items)` after scheduling, for the verify rows: their drafts (at most the reserved count), and
  for a model, the distributions they were drawn from (else None: point masses).

EAGLE / MTP heads would be a third kind: they read the target's hidden states of the last step, which
`propose` would take as an argument; not built."""

from __future__ import annotations

from typing import Any, Protocol

from ..sequence import Sequence


class Proposer(Protocol):
    def available(self, seq: Sequence, k: int) -> int: ...

    def peek(self, seq: Sequence) -> int | None: ...  # the first draft `available` found, if it is free to know

    def propose(self, items: list) -> tuple[dict[int, list[int]], dict[int, Any] | None]: ...

    def release(self, seq: Sequence) -> None: ...


class NgramSource:
    """`NgramProposer` behind the interface: the match is found in `available`, kept until `propose`."""

    def __init__(self, proposer) -> None:
        self.proposer = proposer
        self.pending: dict[int, list[int]] = {}

    def available(self, seq: Sequence, k: int) -> int:
        drafts = self.proposer.propose(seq.token_ids, k)
        self.pending[seq.seq_id] = drafts
        return len(drafts)

    def peek(self, seq: Sequence) -> int | None:
        drafts = self.pending.get(seq.seq_id)
        return drafts[0] if drafts else None

    def propose(self, items: list) -> tuple[dict[int, list[int]], None]:
        out = {}
        for item in items:
            out[item.seq.seq_id] = self.pending.pop(item.seq.seq_id, [])[: item.num_spec_tokens]
        self.pending.clear()
        return out, None

    def release(self, seq: Sequence) -> None:
        self.pending.pop(seq.seq_id, None)
