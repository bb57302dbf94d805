"""The block manager's side of the KV transfer (kv_transfer.py): a prefill's blocks found by the prompt's
tokens, and a decode's imported blocks registered as free, cached blocks that a sequence then hits."""

from native_engine.block_manager import BlockManager
from native_engine.sequence import Sequence

BS = 4


def prefilled(manager: BlockManager, tokens: list[int]) -> Sequence:
    seq = Sequence(tokens, block_size=BS)
    manager.allocate(seq, len(tokens))
    seq.num_computed_tokens = len(tokens)
    manager.hash_blocks(seq)
    return seq


def test_find_prefix_gives_the_cached_blocks_of_a_prompt_and_nothing_for_a_miss():
    manager = BlockManager(8, BS)
    seq = prefilled(manager, list(range(10)))
    manager.free(seq)  # finished: its full blocks stay cached
    assert manager.find_prefix(list(range(10)), 2) == seq_blocks(manager, list(range(8)))
    assert manager.find_prefix([9] + list(range(1, 10)), 2) == []


def seq_blocks(manager: BlockManager, tokens: list[int]) -> list[int]:
    return manager.get_computed_blocks(Sequence(tokens + [0], block_size=BS))


def test_imported_blocks_are_free_cached_blocks_a_new_sequence_hits():
    manager = BlockManager(8, BS)
    tokens = list(range(100, 110))
    targets = manager.import_prefix(tokens, 2)
    assert [i for i, _ in targets] == [0, 1] and manager.num_free_blocks == 8
    seq = Sequence(tokens, block_size=BS)
    manager.allocate(seq, len(tokens) - 8)
    assert seq.block_table[:2] == [b for _, b in targets] and seq.num_computed_tokens == 8
    manager._check_invariants([seq])


def test_only_the_blocks_not_held_already_are_imported_and_the_held_ones_survive():
    manager = BlockManager(4, BS)
    tokens = list(range(12))
    manager.free(prefilled(manager, tokens[:5]))  # holds block 0 of the prompt, free and cached
    targets = manager.import_prefix(tokens, 2)
    assert [i for i, _ in targets] == [1]
    assert len(manager.find_prefix(tokens, 2)) == 2  # the held block was not evicted for the import


def test_too_few_free_blocks_imports_nothing():
    manager = BlockManager(2, BS)
    held = Sequence(list(range(5)), block_size=BS)
    manager.allocate(held, 5)
    assert manager.import_prefix(list(range(50, 62)), 3) == [] and manager.num_free_blocks == 0
