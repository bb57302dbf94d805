"""The engine's narrow hook for speculative decoding (torch-free: a draft model lives in its proposer).

Per step, around the scheduler and the model runner:

    speculator.plan(scheduler.running)      before schedule: each decode row's num_spec_tokens
    out = scheduler.schedule()              reserves KV for 1 + k tokens on verify rows
    drafts = speculator.propose(out)        fills the verify rows' drafts (draft model: runs it)
    sampled = model_runner.run(out..., drafts)   one target forward verifies them
    scheduler.postprocess(out, sampled)     keeps the accepted tokens, frees rejected KV
    speculator.observe(out, sampled, t)     acceptance per sequence and model, step costs

Which sequences speculate: those whose request did not turn it off (`SamplingParams.speculative`), without
penalties, grammar, logprobs or a seed (a seeded request keeps its exact tokens with and without
speculation; the others keep their distribution), in a decode step."""

from __future__ import annotations

from typing import Any

from ..sequence import Sequence
from .adaptive import AdaptiveK
from .config import SpeculativeConfig
from .metrics import SpecDecodingStats
from .proposer import Proposer


def can_speculate(seq: Sequence) -> bool:
    p = seq.sampling_params
    return (p.speculative is not False and p.structured_outputs is None and p.logprobs is None
            and (p.seed is None or p.is_greedy) and p.repetition_penalty == 1.0 and not p.presence_penalty
            and not p.frequency_penalty and seq.num_uncomputed_tokens == 1)


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer) -> None:
        self.config, self.proposer = config, proposer
        self.k = config.num_speculative_tokens
        self.adaptive = AdaptiveK(self.k, config.adaptive)
        self.stats = SpecDecodingStats()
        self.shrunk = False  # this step's proposer gave fewer drafts than planned (a draft model catching up)
        self.shadow: dict[int, tuple[int, int]] = {}  # seq_id -> (its length, the first draft not verified)

    def plan(self, running: list[Sequence]) -> None:
        wants = {}
        decodes = [s for s in running if s.num_uncomputed_tokens == 1]
        for seq in decodes:
            seq.num_spec_tokens = 0
        if not decodes or not self.adaptive.worth_trying(len(decodes)):
            return
        for seq in decodes:
            if can_speculate(seq):
                wants[seq.seq_id] = self.proposer.available(seq, self.k)
        plan = self.adaptive.plan(wants)
        self.shadow = {}
        for seq in decodes:
            seq.num_spec_tokens = plan.get(seq.seq_id, 0)
            first = self.proposer.peek(seq) if wants.get(seq.seq_id) and not seq.num_spec_tokens else None
            if first is not None:
                self.shadow[seq.seq_id] = (len(seq.token_ids), first)

    def propose(self, out) -> dict[int, Any] | None:
        """Drafts into the verify rows of `out` (a SchedulerOutput); -> draft distributions or None."""
        items = [item for item in out.scheduled if item.num_spec_tokens]
        self.shrunk = False
        if not items:
            return None
        drafts, probs = self.proposer.propose(items)
        for item in items:
            planned = item.num_spec_tokens
            out.set_spec_tokens(item, drafts.get(item.seq.seq_id, []))
            self.shrunk |= item.num_spec_tokens < planned
        return probs

    def observe(self, out, sampled: dict[int, list[int]], seconds: float) -> dict[str, tuple[int, int]]:
        """Record the step; -> request id -> (draft tokens, accepted tokens) of its verify rows."""
        per_request: dict[str, tuple[int, int]] = {}
        queries = 0
        for item in out.scheduled:
            queries += item.num_new_tokens
            if not item.num_spec_tokens or item.seq.seq_id not in sampled:
                continue
            accepted = len(sampled[item.seq.seq_id]) - 1
            self.stats.observe(item.num_spec_tokens, accepted)
            self.adaptive.observe(item.seq.seq_id, item.num_spec_tokens, accepted)
            drafts, hits = per_request.get(item.seq.request_id, (0, 0))
            per_request[item.seq.request_id] = (drafts + item.num_spec_tokens, hits + accepted)
        self._check_shadows(out)
        decode_only = all(item.num_new_tokens - item.num_spec_tokens == 1 for item in out.scheduled)
        if out.scheduled and decode_only and not self.shrunk:  # such steps measure what a verify costs
            self.adaptive.record_step(queries, seconds)
        return per_request

    def _check_shadows(self, out) -> None:
        for item in out.scheduled:
            shadow = self.shadow.get(item.seq.seq_id)
            seq = item.seq
            if shadow is not None and not item.num_spec_tokens and seq.num_tokens == shadow[0] + 1:
                self.adaptive.observe_shadow(seq.seq_id, seq.token_ids[shadow[0]] == shadow[1])

    def release(self, seq: Sequence) -> None:
        self.adaptive.forget(seq.seq_id)
        self.proposer.release(seq)
