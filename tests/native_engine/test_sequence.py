import pytest

from native_engine.sampling_params import SamplingParams
from native_engine.sequence import Sequence, SequenceStatus


def test_fields_and_properties():
    prompt = [1, 2, 3, 4, 5, 6]
    seq = Sequence(prompt, SamplingParams(max_tokens=3), priority=2, block_size=4)
    assert seq.token_ids is not prompt and seq.status is SequenceStatus.WAITING
    assert seq.request_id == str(seq.seq_id) and seq.priority == 2 and seq.sample_index == 0
    assert (seq.num_tokens, seq.num_prompt_tokens, seq.num_completion_tokens, len(seq)) == (6, 6, 0, 6)
    assert (seq.num_blocks, seq.last_block_num_tokens) == (2, 2)
    assert seq.block(0) == [1, 2, 3, 4] and seq.block(1) == [5, 6]
    seq.append_token(9)
    assert seq.prompt_token_ids == prompt and seq.completion_token_ids == [9] and seq.last_token == 9


def test_seq_ids_are_unique_and_identity_equality():
    a, b = Sequence([1]), Sequence([1])
    assert a.seq_id != b.seq_id and a != b and len({a, b}) == 2


def test_empty_prompt_rejected():
    with pytest.raises(ValueError, match="at least one prompt token"):
        Sequence([])


def test_is_prefill_until_only_the_last_token_is_uncomputed():
    seq = Sequence([1, 2, 3])
    assert seq.is_prefill and seq.num_uncomputed_tokens == 3
    seq.num_computed_tokens = 2
    assert not seq.is_prefill and seq.num_uncomputed_tokens == 1


def test_fork_copies_values_not_lists():
    parent = Sequence([1, 2, 3], request_id="r", block_size=4)
    parent.append_token(7)
    parent.num_computed_tokens, parent.block_table = 3, [5]
    child = parent.fork(sample_index=2)
    assert child.seq_id != parent.seq_id and child.request_id == "r" and child.sample_index == 2
    assert child.token_ids == parent.token_ids and child.token_ids is not parent.token_ids
    assert child.num_prompt_tokens == 3 and child.completion_token_ids == [7]
    assert child.block_table == [5] and child.block_table is not parent.block_table
    assert child.num_computed_tokens == 3 and child.arrival_time == parent.arrival_time
    assert child.block_size == 4
