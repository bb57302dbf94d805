import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from native_engine.block_manager import BlockManager
from native_engine.config import EngineConfig
from native_engine.sampling_params import SamplingParams
from native_engine.scheduler import ScheduledSequence, Scheduler, SchedulerOutput
from native_engine.sequence import Sequence, SequenceStatus
from tests.native_engine.test_block_manager import FakeKV

VOCAB, EOS = 40, 0


def make_scheduler(num_blocks=64, block_size=4, budget=32, max_num_seqs=8, eos=(EOS,), max_model_len=None, cache=True):
    config = EngineConfig(
        model="unused", block_size=block_size, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs
    )
    return Scheduler(config, BlockManager(num_blocks, block_size, cache), eos, max_model_len)


def fake_token(context, sample_index=0):
    return hash((tuple(context), sample_index)) % VOCAB


class FakeRunner:
    """A deterministic 'model' that reads its context back from a fake paged KV cache."""

    def __init__(self, scheduler):
        self.kv = FakeKV(scheduler.block_manager)

    def run(self, output: SchedulerOutput) -> dict[int, list[int]]:
        destinations = [dst for _, dst in output.blocks_to_copy]
        scheduled_blocks = {b for item in output.scheduled for b in item.seq.block_table}
        assert len(set(destinations)) == len(destinations) and scheduled_blocks.issuperset(destinations)
        self.kv.copy(output.blocks_to_copy)
        for item in output.scheduled:
            start = item.seq.num_computed_tokens
            self.kv.write(item.seq, start, start + item.num_new_tokens)
        sampled = {}
        for item in output.scheduled:  # attention runs after every row wrote its KV
            seq, end = item.seq, item.seq.num_computed_tokens + item.num_new_tokens
            context = self.kv.read(seq, end)
            assert context == seq.token_ids[:end], f"seq {seq.seq_id} read a wrong KV context"
            if item.should_sample:
                sampled[seq.seq_id] = [fake_token(context, i) for i in range(item.num_samples)]
        return sampled


def check_step(scheduler, output):
    assert 0 < output.num_batched_tokens <= scheduler.max_num_batched_tokens or (output.is_empty and output.preempted)
    assert output.num_batched_tokens == sum(item.num_new_tokens for item in output.scheduled)
    assert len(output.scheduled) <= scheduler.max_num_seqs
    assert len({id(item.seq) for item in output.scheduled}) == len(output.scheduled)
    assert all(item.seq.status is SequenceStatus.RUNNING for item in output.scheduled)


def run_all(scheduler, max_steps=5000):
    runner, results = FakeRunner(scheduler), {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished():
            return results
        _, finished = step(scheduler, runner)
        for seq in finished:
            results[seq.request_id, seq.sample_index] = (seq.completion_token_ids, seq.finish_reason)
    raise AssertionError("no progress")


def reference(prompt, params, eos=(EOS,)):
    results = {}
    for i in range(params.n):
        tokens = [*prompt, fake_token(prompt, i)]
        while True:
            last, completion = tokens[-1], tokens[len(prompt) :]
            if (not params.ignore_eos and last in eos) or last in params.stop_token_ids:
                reason = "stop"
            elif len(completion) >= params.max_tokens:
                reason = "length"
            else:
                tokens.append(fake_token(tokens))
                continue
            results[i] = (completion, reason)
            break
    return results


def step(scheduler, runner):
    running = set(scheduler.running)
    output = scheduler.schedule()
    check_step(scheduler, output)
    if output.preempted:  # no admissions in a step that had to preempt
        assert all(item.seq in running for item in output.scheduled)
    return output, scheduler.postprocess(output, runner.run(output))


def add(scheduler, prompt, request_id=None, priority=0, **params):
    seq = Sequence(list(prompt), SamplingParams(**params), request_id or "", priority=priority)
    scheduler.add(seq)
    return seq


# ---- budget, chunking, fairness
def test_long_prompt_is_chunked_and_samples_only_at_the_end():
    scheduler = make_scheduler(budget=8)
    runner = FakeRunner(scheduler)
    seq = add(scheduler, range(1, 21), ignore_eos=True)
    chunks = []
    for _ in range(3):
        output, _ = step(scheduler, runner)
        chunks.append((output.scheduled[0].num_new_tokens, output.scheduled[0].should_sample))
    assert chunks == [(8, False), (8, False), (4, True)]
    assert seq.num_computed_tokens == 20 and seq.num_completion_tokens == 1


def test_decodes_run_every_step_while_a_long_prompt_is_chunked():
    scheduler = make_scheduler(budget=8)
    runner = FakeRunner(scheduler)
    decoders = [add(scheduler, [i + 1, 5], ignore_eos=True, max_tokens=50) for i in range(3)]
    step(scheduler, runner)
    long_seq = add(scheduler, range(1, 40), ignore_eos=True)
    for _ in range(5):
        output, _ = step(scheduler, runner)
        scheduled = {item.seq.seq_id: item.num_new_tokens for item in output.scheduled}
        assert all(scheduled[d.seq_id] == 1 for d in decoders)
        assert scheduled[long_seq.seq_id] == 5 and output.num_batched_tokens == 8


def test_decodes_go_before_prefill_chunks_whatever_the_running_order():
    scheduler = make_scheduler(budget=4)
    runner = FakeRunner(scheduler)
    decoder = add(scheduler, [1, 2], ignore_eos=True, max_tokens=50)
    step(scheduler, runner)
    long_seq = add(scheduler, range(1, 30), ignore_eos=True)
    step(scheduler, runner)
    scheduler.running.reverse()  # put the mid-prefill seq first
    output, _ = step(scheduler, runner)
    assert [(i.seq, i.num_new_tokens) for i in output.scheduled] == [(decoder, 1), (long_seq, 3)]


def test_waiting_prompts_fill_the_remaining_budget_in_one_mixed_batch():
    scheduler = make_scheduler(budget=10)
    runner = FakeRunner(scheduler)
    first = add(scheduler, [1, 2, 3], ignore_eos=True)
    step(scheduler, runner)
    second, third = add(scheduler, range(1, 7)), add(scheduler, range(10, 20))
    output, _ = step(scheduler, runner)
    assert [(i.seq, i.num_new_tokens) for i in output.scheduled] == [(first, 1), (second, 6), (third, 3)]


def test_max_num_seqs_caps_every_step():
    scheduler = make_scheduler(max_num_seqs=2)
    runner = FakeRunner(scheduler)
    for i in range(5):
        add(scheduler, [i + 1, 2, 3], ignore_eos=True, max_tokens=3)
    output, _ = step(scheduler, runner)
    assert len(output.scheduled) == 2 and scheduler.num_waiting == 3 and scheduler.num_running == 2


def test_first_waiting_seq_that_does_not_fit_blocks_later_ones():
    scheduler = make_scheduler(num_blocks=4, block_size=4, budget=64)
    runner = FakeRunner(scheduler)
    add(scheduler, range(1, 10), ignore_eos=True, max_tokens=2)  # 3 blocks
    big = add(scheduler, range(20, 30), ignore_eos=True)  # 3 blocks: does not fit
    small = add(scheduler, [7])  # would fit, but must not overtake
    output, _ = step(scheduler, runner)
    assert len(output.scheduled) == 1 and scheduler.waiting == [big, small]


def test_priority_order_and_fcfs_within_priority():
    scheduler = make_scheduler(max_num_seqs=1)
    seqs = [add(scheduler, [i + 1], request_id=f"r{i}", priority=p, max_tokens=1) for i, p in enumerate([2, 0, 1, 0])]
    assert scheduler.waiting == [seqs[1], seqs[3], seqs[2], seqs[0]]
    order = []
    runner = FakeRunner(scheduler)
    while scheduler.has_unfinished():
        order += [seq.request_id for seq in step(scheduler, runner)[1]]
    assert order == ["r1", "r3", "r2", "r0"]


# ---- preemption
def test_preemption_picks_the_newest_and_puts_it_at_the_front():
    scheduler = make_scheduler(num_blocks=4, block_size=2, budget=64, cache=False)
    runner = FakeRunner(scheduler)
    old = add(scheduler, [1, 2, 3], ignore_eos=True, max_tokens=20)
    new = add(scheduler, [4, 5, 6], ignore_eos=True, max_tokens=20)
    waiting = add(scheduler, [9], priority=0, ignore_eos=True)
    step(scheduler, runner)  # old and new take 2 blocks each; waiting does not fit
    step(scheduler, runner)  # both decode into the second half of their last block
    output, _ = step(scheduler, runner)  # old needs a third block -> new is preempted
    assert output.preempted == [new] and [i.seq for i in output.scheduled] == [old]
    assert scheduler.waiting == [new, waiting] and new.status is SequenceStatus.WAITING
    assert new.block_table == [] and new.num_computed_tokens == 0 and new.num_tokens == 5
    assert scheduler.block_manager.num_free_blocks == 1


def test_victim_already_scheduled_gives_back_its_tokens():
    scheduler = make_scheduler(num_blocks=3, block_size=2, budget=64, cache=False)
    runner = FakeRunner(scheduler)
    low = add(scheduler, [1, 2], priority=1, ignore_eos=True, max_tokens=20)
    step(scheduler, runner)  # low: 1 block
    high = add(scheduler, [4, 5], priority=0, ignore_eos=True, max_tokens=20)
    step(scheduler, runner)  # low decodes into a second block, high takes the last block
    output, _ = step(scheduler, runner)  # low fits and is scheduled; high needs a block -> low preempted
    assert output.preempted == [low] and [i.seq for i in output.scheduled] == [high]
    assert output.num_batched_tokens == 1 and scheduler.block_manager.num_free_blocks == 1


def test_no_admission_in_a_step_that_preempts():
    scheduler = make_scheduler(num_blocks=4, block_size=2, budget=64, cache=False)
    runner = FakeRunner(scheduler)
    old = add(scheduler, [1, 2, 3], ignore_eos=True, max_tokens=20)
    add(scheduler, [4, 5, 6], ignore_eos=True, max_tokens=20)
    step(scheduler, runner)
    step(scheduler, runner)
    urgent = add(scheduler, [7], priority=-1)  # would fit in the block the victim leaves free
    output, _ = step(scheduler, runner)
    assert output.preempted and [i.seq for i in output.scheduled] == [old] and scheduler.waiting[0] is urgent


def test_unscheduling_a_victim_drops_copies_into_its_blocks():
    seq = Sequence([1, 2, 3])
    seq.block_table = [4, 5]
    output = SchedulerOutput()
    output.add(ScheduledSequence(seq, 3))
    output.blocks_to_copy = [(1, 5), (2, 6)]
    output.remove(seq)
    assert output.scheduled == [] and output.num_batched_tokens == 0 and output.blocks_to_copy == [(2, 6)]


def test_resumed_seq_reprefills_prompt_and_generated_tokens():
    scheduler = make_scheduler(budget=64, cache=False)
    runner = FakeRunner(scheduler)
    seq = add(scheduler, [1, 2, 3], ignore_eos=True, max_tokens=10)
    for _ in range(3):
        step(scheduler, runner)
    scheduler.preempt(seq)
    assert scheduler.waiting == [seq] and seq.num_tokens == 6
    output, _ = step(scheduler, runner)
    assert output.scheduled[0].num_new_tokens == 6 and output.scheduled[0].should_sample
    assert seq.num_tokens == 7


def test_resumed_seq_reuses_its_cached_blocks():
    scheduler = make_scheduler(budget=64)
    runner = FakeRunner(scheduler)
    seq = add(scheduler, range(1, 10), ignore_eos=True, max_tokens=10)
    step(scheduler, runner)
    scheduler.preempt(seq)
    output, _ = step(scheduler, runner)
    assert output.scheduled[0].num_new_tokens == 2  # 8 of its 10 tokens sit in cached blocks


# ---- postprocess
@pytest.mark.parametrize(
    ("params", "tokens", "reason", "stop_reason", "completion"),
    [
        ({"max_tokens": 5}, [3, EOS], "stop", None, [3, EOS]),
        ({"max_tokens": 3, "ignore_eos": True}, [3, EOS, 4], "length", None, [3, EOS, 4]),
        ({"max_tokens": 9, "stop_token_ids": [7]}, [3, 7], "stop", 7, [3, 7]),
        ({"max_tokens": 2}, [3, 4], "length", None, [3, 4]),
    ],
)
def test_postprocess_finishing_rules(params, tokens, reason, stop_reason, completion):
    scheduler = make_scheduler()
    seq = add(scheduler, [1, 2, 3], **params)
    finished = []
    for token in tokens:
        output = scheduler.schedule()
        finished = scheduler.postprocess(output, {seq.seq_id: [token]})
    assert finished == [seq] and seq.status is SequenceStatus.FINISHED
    assert (seq.finish_reason, seq.stop_reason, seq.completion_token_ids) == (reason, stop_reason, completion)
    assert scheduler.running == [] and scheduler.block_manager.num_free_blocks == 64 and seq.block_table == []


def test_max_model_len_finishes_with_length():
    scheduler = make_scheduler(max_model_len=5)
    seq = add(scheduler, [1, 2, 3], ignore_eos=True, max_tokens=100)
    assert run_all(scheduler)[seq.request_id, 0][1] == "length" and seq.num_tokens == 5
    with pytest.raises(ValueError, match="more than max_model_len 5"):
        add(scheduler, range(1, 7))


def test_max_model_len_is_capped_by_the_block_pool():
    assert make_scheduler(num_blocks=3, block_size=4, max_model_len=100).max_model_len == 12


def test_abort_frees_blocks_immediately():
    scheduler = make_scheduler()
    running = add(scheduler, [1, 2, 3, 4, 5], request_id="a", max_tokens=10)
    output = scheduler.schedule()
    waiting = add(scheduler, [1], request_id="b")
    assert scheduler.abort("a") == [running] and scheduler.abort("b") == [waiting]
    assert running.finish_reason == "abort" and running.block_table == [] and not scheduler.has_unfinished()
    assert scheduler.block_manager.num_free_blocks == 64
    assert scheduler.postprocess(output, {running.seq_id: [3]}) == [] and running.num_tokens == 5


def test_engine_can_finish_a_seq_for_a_stop_string():
    scheduler = make_scheduler()
    seq = add(scheduler, [1, 2], max_tokens=10)
    scheduler.postprocess(scheduler.schedule(), {seq.seq_id: [5]})
    scheduler.finish(seq, "stop", "###")
    assert (seq.finish_reason, seq.stop_reason) == ("stop", "###") and scheduler.num_running == 0


# ---- n > 1
def test_n_forks_children_after_the_prompt_with_copy_on_write():
    scheduler = make_scheduler(block_size=4)
    parent = add(scheduler, range(1, 7), request_id="r", n=3, ignore_eos=True, max_tokens=4)
    output = scheduler.schedule()
    assert output.scheduled[0].num_samples == 3
    scheduler.postprocess(output, {parent.seq_id: [11, 12, 13]})
    children = output.forked
    assert [(c.request_id, c.sample_index, c.last_token) for c in children] == [("r", 1, 12), ("r", 2, 13)]
    assert parent.sample_index == 0 and parent.last_token == 11 and scheduler.num_running == 3
    assert all(c.block_table == parent.block_table for c in children)
    output = scheduler.schedule()
    assert all(item.num_samples == 1 for item in output.scheduled)
    assert len(output.blocks_to_copy) == 2  # the shared half-full block is copied for two of the three
    scheduler.block_manager._check_invariants(scheduler.running)


def test_n_outputs_match_the_reference():
    scheduler = make_scheduler(block_size=2)
    params = {"n": 3, "max_tokens": 6, "ignore_eos": True}
    add(scheduler, [5, 6, 7], request_id="r", **params)
    results = run_all(scheduler)
    assert {i: results["r", i] for i in range(3)} == reference([5, 6, 7], SamplingParams(**params))
    assert scheduler.block_manager.num_free_blocks == 64


# ---- whole-loop equivalence
requests = st.lists(
    st.tuples(
        st.lists(st.integers(1, 3), min_size=1, max_size=12),  # small alphabet: shared prefixes
        st.integers(1, 8),  # max_tokens
        st.integers(1, 3),  # n
        st.integers(0, 2),  # priority
        st.booleans(),  # ignore_eos
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(
    requests=requests,
    block_size=st.sampled_from([1, 2, 4]),
    budget=st.integers(1, 16),
    max_num_seqs=st.integers(1, 4),
    extra_blocks=st.integers(0, 6),
    cache=st.booleans(),
)
def test_outputs_equal_the_reference_under_pressure(requests, block_size, budget, max_num_seqs, extra_blocks, cache):
    longest = max(len(prompt) + max_tokens for prompt, max_tokens, *_ in requests)
    num_blocks = -(-longest // block_size) + extra_blocks
    scheduler = make_scheduler(num_blocks, block_size, budget, max_num_seqs, cache=cache)
    expected = {}
    for i, (prompt, max_tokens, n, priority, ignore_eos) in enumerate(requests):
        params = SamplingParams(n=n, max_tokens=max_tokens, ignore_eos=ignore_eos, stop_token_ids=[3])
        scheduler.add(Sequence(prompt, params, f"r{i}", priority=priority))
        expected.update({(f"r{i}", k): v for k, v in reference(prompt, params).items()})
    assert run_all(scheduler) == expected
    assert scheduler.block_manager.num_free_blocks == num_blocks
    assert all(block.ref_count == 0 for block in scheduler.block_manager.blocks)


class SchedulerMachine(RuleBasedStateMachine):
    """Random add / step / abort / finish / preempt; no block may leak and every step keeps its limits."""

    @initialize(block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(3, 12), budget=st.integers(1, 12))
    def setup(self, block_size, num_blocks, budget):
        self.scheduler = make_scheduler(num_blocks, block_size, budget, max_num_seqs=3)
        self.runner = FakeRunner(self.scheduler)
        self.num_requests = 0

    @rule(prompt=st.lists(st.integers(1, 3), min_size=1, max_size=8), n=st.integers(1, 2), priority=st.integers(0, 1))
    def add_request(self, prompt, n, priority):
        prompt = prompt[: self.scheduler.max_model_len]
        self.num_requests += 1
        add(self.scheduler, prompt, f"r{self.num_requests}", priority, n=n, max_tokens=6)

    @precondition(lambda self: self.scheduler.has_unfinished())
    @rule()
    def step(self):
        step(self.scheduler, self.runner)

    @precondition(lambda self: self.scheduler.has_unfinished())
    @rule(pick=st.integers(0, 100))
    def abort(self, pick):
        seqs = self.scheduler.waiting + self.scheduler.running
        self.scheduler.abort(seqs[pick % len(seqs)].request_id)

    @precondition(lambda self: self.scheduler.running)
    @rule(pick=st.integers(0, 100), preempt=st.booleans())
    def finish_or_preempt(self, pick, preempt):
        seq = self.scheduler.running[pick % len(self.scheduler.running)]
        self.scheduler.preempt(seq) if preempt else self.scheduler.finish(seq, "stop", "stop string")

    @invariant()
    def blocks_are_exactly_referenced(self):
        scheduler = self.scheduler
        scheduler.block_manager._check_invariants(scheduler.running + scheduler.waiting)
        assert all(not seq.block_table for seq in scheduler.waiting)

    def teardown(self):
        for _ in range(500):
            if not self.scheduler.has_unfinished():
                break
            step(self.scheduler, self.runner)
        manager = self.scheduler.block_manager
        assert not self.scheduler.has_unfinished()
        assert manager.num_free_blocks == manager.num_total_blocks
        assert all(block.ref_count == 0 for block in manager.blocks)


SchedulerMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestSchedulerMachine = SchedulerMachine.TestCase
