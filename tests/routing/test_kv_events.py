"""vLLM's KV cache events: both msgpack encodings decode, the block index follows stores, removals and
clears, a request's token blocks match what is held, and a sequence gap starts the index over."""

from __future__ import annotations

import msgspec

from routing.kv_events import BlockIndex, KVEventSource, decode_batch


def stored(hashes, parent, ids, size=4):
    return ["BlockStored", hashes, parent, ids, size, None, "GPU"]


def test_both_encodings_decode():
    array = msgspec.msgpack.encode([1.5, [stored([1], None, [5, 6, 7, 8]), ["BlockRemoved", [1], "GPU"],
                                          ["AllBlocksCleared"], ["SomethingNew", 1]]])
    assert [kind for kind, _ in decode_batch(array)] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    mapped = msgspec.msgpack.encode({"ts": 1.5, "events": [
        {"type": "BlockStored", "block_hashes": [b"\x01" * 32], "parent_block_hash": None, "token_ids": [1, 2],
         "block_size": 2, "lora_id": None, "medium": "GPU", "lora_name": None}]})
    [(kind, fields)] = decode_batch(mapped)
    assert kind == "BlockStored" and fields["block_hashes"] == [b"\x01" * 32] and fields["token_ids"] == [1, 2]


def test_the_index_matches_whole_leading_blocks_it_holds():
    index = BlockIndex()
    index.apply("BlockStored", dict(zip(("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                         "medium"), stored([10, 11], None, list(range(8)))[1:])))
    index.stored([12], 11, [8, 9, 10, 11], 4)          # a third block, chained on the second
    index.stored([99], 777, [1, 1, 1, 1], 4)            # its parent is unknown: not matchable
    assert index.match(list(range(12)) + [50, 51]) == 12
    assert index.match(list(range(6)) + [0, 0]) == 4    # the second block differs
    assert index.match([1, 1, 1, 1]) == 0
    index.removed([11])
    assert index.match(list(range(12))) == 4            # the chain is broken after the first block
    index.apply("BlockStored", {"block_hashes": [20], "parent_block_hash": None, "token_ids": [3, 3, 3, 3],
                                "block_size": 4, "medium": "CPU"})
    assert index.match([3, 3, 3, 3]) == 0               # offloaded blocks are not the GPU's
    index.apply("AllBlocksCleared", {})
    assert index.match(list(range(4))) == 0 and index.keys == {}


def test_a_sequence_gap_starts_the_index_over():
    source = KVEventSource("vllm-a", "tcp://127.0.0.1:1", "tok.json")
    message = lambda seq, events: [b"", seq.to_bytes(8, "big"), msgspec.msgpack.encode([0.0, events])]  # noqa: E731
    source.receive(message(7, [stored([1], None, [1, 2, 3, 4])]))
    source.receive(message(8, [stored([2], 1, [5, 6, 7, 8])]))
    assert source.index.match([1, 2, 3, 4, 5, 6, 7, 8]) == 8
    source.receive(message(10, []))                      # 9 was lost: it may have removed blocks
    assert source.index.match([1, 2, 3, 4]) == 0 and source.index.gaps == 1
    source.receive([b"", b"\x00" * 8, b"\xc1"])          # unreadable: skipped, nothing breaks
    assert source.index.events == 2


def test_a_silent_subscription_is_logged_once_naming_its_endpoint(caplog):
    """vLLM started with tcp://127.0.0.1:PORT publishes nowhere: 30 s of requests without an event is one
    warning naming the endpoint; an event ends the silence, and the next one is logged again."""
    source = KVEventSource("vllm-a", "tcp://127.0.0.1:5557", "tok.json")
    message = [b"", (1).to_bytes(8, "big"), msgspec.msgpack.encode([0.0, []])]
    with caplog.at_level("WARNING", logger="routing.kv_events"):
        source.served(100.0)
        source.served(129.0)
        assert caplog.records == []                     # 29 s: not yet
        source.served(130.0)
        source.served(200.0)
        source.receive(message)
        source.served(300.0)
        source.served(320.0)
        assert len(caplog.records) == 1                 # once per silence
        source.served(330.0)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and all("tcp://127.0.0.1:5557" in w and "tcp://*:PORT" in w for w in warnings)
