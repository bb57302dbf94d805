"""Speculative decoding's bookkeeping without torch: verify rows in the scheduler, KV rollback, prefix-cache
hashes after rejections. A fake target reads its context back from a fake paged KV cache (FakeKV), so a
wrong slot, a stale rejected token or a wrong hash shows up as a wrong token."""

import random

import pytest

from native_engine.sequence import SequenceStatus
from tests.native_engine.test_block_manager import FakeKV
from tests.native_engine.test_scheduler import add, check_step, fake_token, make_scheduler, reference


class FakeVerifier:
    """A deterministic 'target model': writes every scheduled token's KV (drafts included), reads each query
    position's context back from the cache, and keeps drafts while they equal its own token."""

    def __init__(self, scheduler, propose):
        self.scheduler, self.kv, self.propose = scheduler, FakeKV(scheduler.block_manager), propose
        self.drafted = self.accepted = 0

    def step(self):
        out = self.scheduler.schedule()
        check_step(self.scheduler, out)
        for item in out.scheduled:
            if item.num_spec_tokens:
                out.set_spec_tokens(item, self.propose(item.seq)[: item.num_spec_tokens])
        self.kv.copy(out.blocks_to_copy)
        for item in out.scheduled:
            start = item.seq.num_computed_tokens
            for pos, token in enumerate(item.token_ids(), start):
                self.kv.slots[self.kv._slot(item.seq, pos)] = token
        sampled = {item.seq.seq_id: self._tokens(item) for item in out.scheduled if item.should_sample}
        return self.scheduler.postprocess(out, sampled)

    def _tokens(self, item):
        seq, start = item.seq, item.seq.num_computed_tokens
        ids = seq.token_ids[:start] + item.token_ids()
        context_end = start + item.num_new_tokens - item.num_spec_tokens
        out = []
        for j in range(item.num_spec_tokens + 1):
            end = context_end + j
            assert [self.kv.slots[self.kv._slot(seq, p)] for p in range(end)] == ids[:end], "read a wrong KV"
            token = fake_token(ids[:end], item.num_samples - 1 if not item.num_spec_tokens else 0)
            out.append(token)
            if j < item.num_spec_tokens and token != item.spec_token_ids[j]:
                break
        self.drafted += item.num_spec_tokens
        self.accepted += len(out) - 1
        if not item.num_spec_tokens and item.num_samples > 1:
            return [fake_token(ids, i) for i in range(item.num_samples)]
        return out if item.num_spec_tokens else [fake_token(ids)]


def oracle_proposer(rng, hit_rate):
    """Drafts from the fake target's own continuation, each wrong with probability 1 - hit_rate."""
    def propose(seq):
        ids, drafts = list(seq.token_ids), []
        for _ in range(6):
            token = fake_token(ids) if rng.random() < hit_rate else (fake_token(ids) + 1) % 40
            drafts.append(token)
            ids.append(token)
        return drafts
    return propose


def run(scheduler, verifier, plan_k, max_steps=3000):
    results = {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished():
            return results
        for seq in scheduler.running:
            seq.num_spec_tokens = plan_k
        for seq in verifier.step():
            results[seq.request_id] = (seq.completion_token_ids, seq.finish_reason)
        scheduler.block_manager._check_invariants(scheduler.running)
        for seq in scheduler.running:  # the table covers the computed tokens (+ nothing after postprocess)
            assert len(seq.block_table) == -(-seq.num_computed_tokens // scheduler.block_manager.block_size)
    raise AssertionError("no progress")


@pytest.mark.parametrize("hit_rate", [0.0, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_verified_output_equals_plain_decoding(hit_rate, k):
    scheduler = make_scheduler(num_blocks=48, block_size=4, budget=24, max_num_seqs=4)
    verifier = FakeVerifier(scheduler, oracle_proposer(random.Random(k), hit_rate))
    prompts = [[1 + i, 7, 9, 3 + i] * (1 + i) for i in range(6)]
    for i, prompt in enumerate(prompts):
        add(scheduler, prompt, request_id=f"r{i}", max_tokens=17 + i, ignore_eos=i % 2 == 0)
    results = run(scheduler, verifier, k)
    for i, prompt in enumerate(prompts):
        expected = reference(prompt, add.__globals__["SamplingParams"](max_tokens=17 + i, ignore_eos=i % 2 == 0))[0]
        assert results[f"r{i}"] == expected
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_total_blocks
    if hit_rate == 1.0:
        assert verifier.accepted == verifier.drafted > 0
    if hit_rate == 0.0:
        assert verifier.accepted == 0 and verifier.drafted > 0


def test_rejected_blocks_are_freed_and_never_hashed():
    scheduler = make_scheduler(num_blocks=16, block_size=4, budget=32)
    manager = scheduler.block_manager
    seq = add(scheduler, [5, 6, 7], max_tokens=40, ignore_eos=True)
    wrong = lambda s: [(fake_token(s.token_ids) + 1) % 40] * 6  # noqa: E731 -- every draft is rejected
    verifier = FakeVerifier(scheduler, wrong)
    verifier.step()  # the prompt: 3 tokens computed, 1 sampled
    seq.num_spec_tokens = 6
    out = scheduler.schedule()
    out.set_spec_tokens(out.scheduled[0], wrong(seq))
    reserved = list(seq.block_table)
    assert len(reserved) == 3  # positions 0..9: the last token and 6 drafts
    scheduler.postprocess(out, {seq.seq_id: [fake_token(seq.token_ids)]})  # all 6 rejected
    assert seq.num_computed_tokens == 4 and seq.num_tokens == 5
    assert seq.block_table == reserved[:1]  # positions 0..3: the drafts' blocks went back
    assert all(manager.blocks[b].ref_count == 0 and manager.blocks[b].hash == -1 for b in reserved[1:])
    assert list(manager.free_block_ids)[:2] == reserved[1:][::-1] or set(reserved[1:]) <= set(manager.free_block_ids)
    block = manager.blocks[reserved[0]]  # full of computed tokens: hashed, with the right tokens
    assert block.token_ids == seq.token_ids[:4] and manager.hash_to_block_id[block.hash] == block.block_id
    manager._check_invariants([seq])


def test_prefix_cache_after_rejections_serves_the_right_tokens():
    """Blocks hashed after verify steps with rejections hold exactly the accepted tokens: a second request
    with the first one's prompt + output hits them and reads them back right (FakeVerifier checks)."""
    scheduler = make_scheduler(num_blocks=64, block_size=4, budget=32)
    verifier = FakeVerifier(scheduler, oracle_proposer(random.Random(1), 0.6))
    first = add(scheduler, [3, 1, 4, 1, 5, 9, 2, 6], request_id="a", max_tokens=30, ignore_eos=True)
    results = run(scheduler, verifier, 4)
    assert verifier.accepted > 0 and verifier.drafted > verifier.accepted
    history = first.prompt_token_ids + results["a"][0]
    second = add(scheduler, history, request_id="b", max_tokens=8, ignore_eos=True)
    run(scheduler, verifier, 4)
    assert second.num_cached_tokens >= 32  # the hashed blocks of the first request were found
    assert second.status is SequenceStatus.FINISHED


def test_spec_tokens_respect_budget_max_tokens_and_context():
    scheduler = make_scheduler(num_blocks=64, block_size=4, budget=6, max_model_len=30)
    verifier = FakeVerifier(scheduler, oracle_proposer(random.Random(0), 1.0))
    seqs = [add(scheduler, [1, 2, 3], request_id=f"s{i}", max_tokens=5 + 40 * i, ignore_eos=True) for i in range(2)]
    verifier.step()
    verifier.step()
    for seq in seqs:
        seq.num_spec_tokens = 8
    out = scheduler.schedule()
    assert out.num_batched_tokens <= 6
    assert all(i.num_spec_tokens <= 5 - 1 for i in out.scheduled)
    results = run(scheduler, verifier, 8)
    assert len(results["s0"][0]) == 5 and results["s1"] == (results["s1"][0], "length")
    assert seqs[1].num_tokens == 30  # stopped at max_model_len, not past it


def test_unused_reservation_shrinks_the_row():
    scheduler = make_scheduler(budget=32)
    verifier = FakeVerifier(scheduler, lambda seq: [])
    seq = add(scheduler, [1, 2, 3], max_tokens=20, ignore_eos=True)
    verifier.step()
    seq.num_spec_tokens = 4
    out = scheduler.schedule()
    item = out.scheduled[0]
    assert (item.num_new_tokens, item.num_spec_tokens, out.num_batched_tokens) == (5, 4, 5)
    out.set_spec_tokens(item, [7])
    assert (item.num_new_tokens, item.num_spec_tokens, out.num_batched_tokens) == (2, 1, 2)
    assert item.token_ids() == [seq.last_token, 7]
