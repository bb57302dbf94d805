import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from native_engine import block_manager as bm_module
from native_engine.block_manager import BlockManager
from native_engine.sequence import Sequence


class FakeKV:
    """Slot store standing in for the KV cache: records which token each slot holds."""

    def __init__(self, manager: BlockManager):
        self.bs = manager.block_size
        self.slots: list[int | None] = [None] * (manager.num_total_blocks * self.bs)

    def copy(self, pairs):
        saved = [self.slots[src * self.bs : (src + 1) * self.bs] for src, _ in pairs]
        for (_, dst), values in zip(pairs, saved):
            self.slots[dst * self.bs : (dst + 1) * self.bs] = values

    def write(self, seq, start, end):
        for pos in range(start, end):
            self.slots[self._slot(seq, pos)] = seq.token_ids[pos]

    def read(self, seq, end):
        return [self.slots[self._slot(seq, pos)] for pos in range(end)]

    def _slot(self, seq, pos):
        return seq.block_table[pos // self.bs] * self.bs + pos % self.bs


def compute(manager, seq, num_new_tokens, kv=None, hits=None):
    """What one step does for seq: allocate, copy, write KV, advance, register hashes."""
    copies = manager.allocate(seq, num_new_tokens, hits)
    start = seq.num_computed_tokens
    if kv is not None:
        kv.copy(copies)
        kv.write(seq, start, start + num_new_tokens)
    seq.num_computed_tokens += num_new_tokens
    manager.hash_blocks(seq)
    return copies


def refs(manager, seq):
    return [manager.blocks[b].ref_count for b in seq.block_table]


def test_allocate_and_free_ref_counts():
    manager = BlockManager(8, 4)
    seq = Sequence(list(range(10)))
    assert manager.can_allocate(seq, 10)
    assert manager.allocate(seq, 10) == []
    assert len(seq.block_table) == 3 and refs(manager, seq) == [1, 1, 1]
    assert manager.num_free_blocks == 5 and manager.usage == pytest.approx(3 / 8)
    manager.free(seq)
    assert seq.block_table == [] and seq.num_computed_tokens == 0
    assert manager.num_free_blocks == 8 and all(b.ref_count == 0 for b in manager.blocks)
    manager._check_invariants([])


def test_chunks_grow_the_table_exactly():
    manager = BlockManager(8, 4)
    seq = Sequence(list(range(10)))
    compute(manager, seq, 3)
    assert len(seq.block_table) == 1
    compute(manager, seq, 2)
    assert len(seq.block_table) == 2
    assert not manager.can_allocate(seq, 100)


def test_fork_shares_blocks_until_freed():
    manager = BlockManager(8, 4)
    parent = Sequence(list(range(6)))
    compute(manager, parent, 6)
    child = parent.fork(1)
    manager.fork(parent, child)
    assert child.block_table == parent.block_table and refs(manager, parent) == [2, 2]
    manager._check_invariants([parent, child])
    manager.free(parent)
    assert refs(manager, child) == [1, 1]
    manager.free(child)
    assert manager.num_free_blocks == 8


def test_prefix_hit_reuses_blocks_and_sets_cached_tokens():
    manager = BlockManager(16, 4)
    a = Sequence(list(range(10)))
    compute(manager, a, 10)
    assert manager.num_cached_blocks == 2  # the partial third block is not cached
    b = Sequence(list(range(8)) + [50, 51, 52])
    assert manager.get_computed_blocks(b) == a.block_table[:2]
    compute(manager, b, 3)
    assert b.block_table[:2] == a.block_table[:2] and b.num_cached_tokens == 8 and b.num_computed_tokens == 11
    assert refs(manager, b) == [2, 2, 1]
    manager.free(a)
    manager.free(b)
    c = Sequence(list(range(9)))  # hits blocks that are free but still cached
    free_before = manager.num_free_blocks
    compute(manager, c, 1)
    assert c.num_cached_tokens == 8 and manager.num_free_blocks == free_before - 3
    assert manager.num_prefix_hit_tokens == 16 and manager.num_prefix_query_tokens == 30


def test_never_all_tokens_hit():
    manager = BlockManager(16, 4)
    a = Sequence(list(range(8)))
    compute(manager, a, 8)
    b = Sequence(list(range(8)))
    assert len(manager.get_computed_blocks(b)) == 1  # the last token must run to produce logits
    manager.allocate(b, 4)
    assert b.num_computed_tokens == 4


def test_only_computed_full_blocks_are_hashed():
    manager = BlockManager(8, 4)
    seq = Sequence(list(range(12)))
    compute(manager, seq, 6)
    assert [manager.blocks[b].hash != -1 for b in seq.block_table] == [True, False]
    compute(manager, seq, 6)
    assert all(manager.blocks[b].hash != -1 for b in seq.block_table)


def test_hash_collision_with_different_tokens_is_no_hit(monkeypatch):
    monkeypatch.setattr(bm_module, "compute_hash", lambda token_ids, prefix_hash=-1: 42)
    manager = BlockManager(8, 4)
    compute(manager, Sequence([1, 2, 3, 4, 5]), 5)
    assert manager.get_computed_blocks(Sequence([9, 9, 9, 9, 5])) == []
    assert len(manager.get_computed_blocks(Sequence([1, 2, 3, 4, 6]))) == 1


def test_lru_eviction_order():
    manager = BlockManager(4, 2)
    cached = [Sequence([i, i, 0]) for i in (1, 2, 3)]
    for seq in cached:
        compute(manager, seq, 3)
        manager.free(seq)  # the partial block is unhashed and goes to the front of the free list
    assert manager.num_cached_blocks == 3
    for seq in cached:
        assert len(manager.get_computed_blocks(Sequence(seq.token_ids))) == 1
    compute(manager, Sequence([7]), 1)  # takes the one uncached free block
    assert manager.num_cached_blocks == 3
    compute(manager, Sequence([8]), 1)  # evicts the least recently freed cached block: seq 1's
    hits = [len(manager.get_computed_blocks(Sequence(seq.token_ids))) for seq in cached]
    assert hits == [0, 1, 1]
    manager._check_invariants()


def test_free_in_reverse_order_keeps_prefixes_longest():
    manager = BlockManager(4, 2)
    seq = Sequence([1, 2, 3, 4, 5, 6, 7])
    compute(manager, seq, 7)
    manager.free(seq)
    compute(manager, Sequence([0, 0]), 2)  # uncached partial block reused first
    compute(manager, Sequence([0, 1]), 2)  # then the last full block of seq
    assert len(manager.get_computed_blocks(Sequence([1, 2, 3, 4, 5, 6, 7]))) == 2


def test_copy_on_write_when_the_last_block_is_shared():
    manager = BlockManager(8, 4)
    parent = Sequence([1, 2, 3, 4, 5, 6])
    compute(manager, parent, 6)
    child = parent.fork(1)
    manager.fork(parent, child)
    parent.append_token(7)
    child.append_token(8)
    shared = parent.block_table[1]
    assert manager.can_append(parent) and manager._num_required_blocks(parent, 1, None) == 1
    copies = manager.append(parent)
    assert copies == [(shared, parent.block_table[1])] and parent.block_table[1] != shared
    assert parent.block_table[0] == child.block_table[0] and manager.blocks[shared].ref_count == 1
    assert manager.append(child) == [] and child.block_table[1] == shared
    manager._check_invariants([parent, child])


def test_no_copy_when_fork_is_block_aligned():
    manager = BlockManager(8, 4)
    parent = Sequence([1, 2, 3, 4])
    compute(manager, parent, 4)
    child = parent.fork(1)
    manager.fork(parent, child)
    parent.append_token(5)
    assert manager.append(parent) == [] and len(parent.block_table) == 2


def test_kv_waste_counts_unused_slots():
    manager = BlockManager(8, 4)
    a, b = Sequence(list(range(5))), Sequence(list(range(4)))
    manager.allocate(a, 5)
    manager.allocate(b, 4)
    assert manager.kv_waste([a, b]) == pytest.approx(3 / 12)
    assert manager.kv_waste([]) == 0.0


def test_prefix_caching_disabled():
    manager = BlockManager(8, 4, enable_prefix_caching=False)
    a = Sequence(list(range(9)))
    compute(manager, a, 9)
    assert manager.num_cached_blocks == 0 and manager.get_computed_blocks(Sequence(list(range(9)))) == []


def test_can_allocate_counts_free_cached_hits():
    manager = BlockManager(3, 2)
    a = Sequence([1, 2, 3, 4, 5])
    compute(manager, a, 5)
    manager.free(a)
    b = Sequence([1, 2, 3, 4, 9])  # two cached hits sit in the free list, plus one new block
    assert manager.can_allocate(b, 1) and manager._num_required_blocks(b, 1, None) == 3
    manager.allocate(b, 1)
    assert manager.num_free_blocks == 0 and b.num_computed_tokens == 4


def test_bad_sizes():
    with pytest.raises(ValueError, match="num_blocks >= 1"):
        BlockManager(0, 16)


ops = st.lists(
    st.tuples(st.sampled_from(["new", "step", "fork", "free", "append"]), st.integers(0, 50), st.integers(1, 9)),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(4, 24))
def test_random_ops_keep_refs_exact_and_kv_consistent(ops, block_size, num_blocks):
    manager = BlockManager(num_blocks, block_size)
    kv = FakeKV(manager)
    live: list[Sequence] = []
    for op, pick, size in ops:
        seq = live[pick % len(live)] if live else None
        if op == "new":
            seq = Sequence([t % 3 for t in range(pick % 5, pick % 5 + size)])
            hits = manager.get_computed_blocks(seq)
            n = min(pick % 4 + 1, seq.num_tokens - len(hits) * block_size)
            if manager.can_allocate(seq, n, hits):
                compute(manager, seq, n, kv, hits)
                live.append(seq)
        elif seq is None:
            continue
        elif op == "step" and seq.num_uncomputed_tokens:
            n = min(size, seq.num_uncomputed_tokens)
            if manager.can_allocate(seq, n):
                compute(manager, seq, n, kv)
        elif op == "append" and not seq.num_uncomputed_tokens:
            seq.append_token(pick % 3)
        elif op == "fork" and not seq.num_uncomputed_tokens:
            child = seq.fork(1)
            manager.fork(seq, child)
            live.append(child)
        elif op == "free":
            manager.free(seq)
            live.remove(seq)
        manager._check_invariants(live)
        for s in live:
            assert kv.read(s, s.num_computed_tokens) == s.token_ids[: s.num_computed_tokens]
    for seq in live:
        manager.free(seq)
    assert manager.num_free_blocks == num_blocks and all(b.ref_count == 0 for b in manager.blocks)
