"""vLLM's KV cache events for the fakes: a ZMQ PUB socket sending ``(topic, 8-byte big-endian sequence
number, msgpack EventBatch)`` as vLLM 0.9-0.10 writes them (msgspec ``array_like`` structs: the batch
``[ts, events]``, each event ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium]``, ``["BlockRemoved", block_hashes, medium]`` or ``["AllBlocksCleared"]``).

``WordVocab`` gives the fakes token ids: a word's id in a ``tokenizer.json`` (a WordLevel vocabulary
with whitespace splitting, so a gateway that tokenizes with the same file gets the same ids), else a
CRC-32 of the word.
"""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

import msgspec
import zmq


class WordVocab:
    def __init__(self, tokenizer: str = ""):
        self.vocab: dict[str, int] = {}
        self.unk = 0
        if tokenizer:
            model = json.loads(Path(tokenizer).read_text())["model"]
            self.vocab = model["vocab"]
            self.unk = self.vocab.get(model.get("unk_token") or "", 0)

    def ids(self, words: list[str]) -> list[int]:
        if self.vocab:
            return [self.vocab.get(w, self.unk) for w in words]
        return [zlib.crc32(w.encode()) for w in words]


class KVEventPublisher:
    """Binds ``tcp://127.0.0.1:port`` and publishes each batch at once (PUB never blocks)."""

    def __init__(self, port: int, topic: str = ""):
        self.socket = zmq.Context.instance().socket(zmq.PUB)
        self.socket.bind(f"tcp://127.0.0.1:{port}")
        self.topic, self.seq = topic.encode(), 0

    def publish(self, events: list[list]) -> None:
        if not events:
            return
        payload = msgspec.msgpack.encode([time.time(), events])
        self.socket.send_multipart([self.topic, self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    def stored(self, hashes: list[int], parent: int | None, token_ids: list[int], block_size: int) -> list:
        return ["BlockStored", hashes, parent, token_ids, block_size, None, "GPU"]

    def close(self) -> None:
        self.socket.close(linger=0)
