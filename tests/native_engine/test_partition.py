"""Which heads, KV heads, MLP rows and vocabulary rows each tensor-parallel rank holds (torch-free)."""

from __future__ import annotations

import pytest

from native_engine.distributed.partition import (Span, balanced, head_spans, legal_sizes, max_kv_heads, shard_model,
                                                 tensor_parallel_problem)


def test_balanced_spans_cover_the_whole_in_order():
    assert balanced(10, 3) == [Span(0, 4), Span(4, 3), Span(7, 3)]
    assert balanced(1024, 3, 64) == [Span(0, 384), Span(384, 320), Span(704, 320)]
    assert balanced(100, 2, 32) == [Span(0, 64), Span(64, 36)]  # the remainder that is not a unit: the last


def test_smollm2_heads_split_legally():
    """9 query heads, 3 KV heads: 2 ranks take 2 + 1 KV heads (6 + 3 query heads), 3 one each, 9 one query
    head each with its KV head on three ranks; 4..8 would part a query head from its KV head."""
    assert legal_sizes(9, 3) == [1, 2, 3, 9]
    assert head_spans(9, 3, 2) == [(Span(0, 6), Span(0, 2)), (Span(6, 3), Span(2, 1))]
    assert head_spans(9, 3, 3) == [(Span(3 * r, 3), Span(r, 1)) for r in range(3)]
    assert head_spans(9, 3, 9) == [(Span(r, 1), Span(r // 3, 1)) for r in range(9)]
    for bad in (4, 5, 6, 7, 8):
        assert "legal sizes: 1, 2, 3, 9" in tensor_parallel_problem(9, 3, bad)


@pytest.mark.parametrize("heads, kv, legal", [(4, 2, [1, 2, 4]), (4, 4, [1, 2, 3, 4]), (14, 2, [1, 2, 14]),
                                               (32, 8, [1, 2, 3, 4, 5, 6, 7, 8, 16, 32]), (28, 4, [1, 2, 3, 4, 28])])
def test_every_legal_size_keeps_query_heads_with_their_kv_heads(heads, kv, legal):
    assert legal_sizes(heads, kv) == legal
    group = heads // kv
    for n in legal:
        spans = head_spans(heads, kv, n)
        assert sum(q.size for q, _ in spans) == heads and spans[-1][0].end == heads
        for q, k in spans:
            assert {h // group for h in range(q.start, q.end)} == set(range(k.start, k.end))
            assert q.size == k.size * group or (k.size == 1 and group % q.size == 0)


def test_a_rank_shard_of_smollm2():
    two = [shard_model(9, 3, 1536, 49152, r, 2) for r in range(2)]
    assert [s.intermediate for s in two] == [Span(0, 768), Span(768, 768)]
    assert [s.vocab for s in two] == [Span(0, 24576), Span(24576, 24576)] and two[0].vocab_sizes == (24576, 24576)
    nine = shard_model(9, 3, 1536, 49152, 8, 9)
    assert nine.intermediate.size % 32 == 0 and nine.vocab.end == 49152  # whole 32-weight blocks per rank
    assert max_kv_heads(9, 3, 2) == 2 and max_kv_heads(9, 3, 9) == 1
    assert not shard_model(9, 3, 1536, 49152, 0, 1).is_sharded
