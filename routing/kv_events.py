"""Precise prefix routing: what a backend holds in its KV cache, block by block, from its own events.

**Which backends publish.** vLLM (0.9 and later) publishes KV cache events when started with
``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}'``
(llm-d's precise prefix scorer and NVIDIA Dynamo's KV router read the same stream). The other
backends are indexed approximately (``prefix.py``): TGI, TensorRT-LLM's ``trtllm-serve``, Ollama and
llama.cpp's server publish no cache state over an interface this gateway reads; our in-process
engines (the native engine's block table, llama.cpp's slots) report the cached tokens of each request
in its usage, which the route compares with what it expected, but publish no block events to routes.

**The wire.** A ZMQ PUB socket; each message is three frames: topic, an 8-byte big-endian sequence
number, and a msgpack ``EventBatch`` (``ts``, ``events``, ``data_parallel_rank``), written by msgspec
as an array in vLLM 0.9-0.10 and as a map later; every event is tagged with its class name:
``BlockStored`` (``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id``,
``medium``, ...), ``BlockRemoved`` (``block_hashes``, ``medium``), ``AllBlocksCleared``. Both
encodings are read; blocks in a medium other than the GPU's (CPU offload) are ignored.

**The index** (:class:`BlockIndex`) mirrors one backend: each stored block gets a key chained over
its parent's (a hash of the parent's key and the block's token ids), so a key stands for the whole
token prefix up to its block, as vLLM's own block hash does; vLLM's hashes (ints or bytes, salted
per server) are used only to find a block's parent and to remove it. A request is matched by its
token ids (its chat rendered with the backend's chat template and tokenized with the backend's
tokenizer, the backend entry's ``tokenizer:``), cut into blocks of the backend's block size: the
leading blocks present are the tokens the backend will find cached, until it evicts them and says so.

A gap in the sequence numbers means events were lost (ZMQ's high-water mark, a backend restart):
the index is cleared and rebuilt from what follows, so it errs toward no match.

**The endpoint.** vLLM's publisher *binds* a wildcard (``tcp://*:5557``) or ``ipc://`` endpoint and
*connects* to any other: a vLLM started with ``tcp://127.0.0.1:5557`` publishes nowhere, and the
gateway subscribed to that address hears nothing. A subscription that hears nothing for
``SILENCE_S`` seconds while its backend serves requests logs one warning naming the endpoint (again
after the next silence, once events have come), since precise routing then matches nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

log = logging.getLogger(__name__)
SILENCE_S = 30.0  # no event for this long while requests are served: logged once

_ROOT = hash("kv-events")
_FIELDS = {  # the array form's field order (vLLM 0.9-0.10: msgspec array_like structs)
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}
_GPU = (None, "GPU", "gpu")


def decode_batch(payload: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The events of one ``EventBatch`` payload as ``(kind, fields)``; unknown kinds are dropped."""
    batch = msgspec.msgpack.decode(payload)
    events = batch[1] if isinstance(batch, list) else (batch or {}).get("events", [])
    out = []
    for event in events or ():
        if isinstance(event, list) and event and event[0] in _FIELDS:
            out.append((event[0], dict(zip(_FIELDS[event[0]], event[1:]))))
        elif isinstance(event, dict) and event.get("type") in _FIELDS:
            out.append((event["type"], event))
    return out


@dataclass
class BlockIndex:
    """The blocks one backend holds, as its events tell them."""

    keys: dict[Any, int] = field(default_factory=dict)      # vLLM's block hash → our chained key
    held: dict[int, int] = field(default_factory=dict)      # our key → how many of its blocks are held
    block_size: int = 0
    events: int = 0
    gaps: int = 0
    last_seq: int | None = None

    def apply(self, kind: str, fields: dict[str, Any]) -> None:
        self.events += 1
        if kind == "AllBlocksCleared":
            self.clear()
        elif fields.get("medium") not in _GPU:
            return
        elif kind == "BlockStored":
            self.stored(fields["block_hashes"], fields.get("parent_block_hash"), fields["token_ids"],
                        int(fields["block_size"]))
        elif kind == "BlockRemoved":
            self.removed(fields["block_hashes"])

    def stored(self, hashes: list[Any], parent: Any, token_ids: list[int], block_size: int) -> None:
        """Blocks ``hashes`` (in order, the first one's parent ``parent``) hold ``token_ids``."""
        self.block_size = block_size
        key = _ROOT if parent is None else self.keys.get(_hashable(parent))
        if key is None:  # its parent is unknown (evicted meanwhile, or before we subscribed): unmatchable
            return
        for i, block in enumerate(hashes):
            key = hash((key, tuple(token_ids[i * block_size:(i + 1) * block_size])))
            block = _hashable(block)
            if block not in self.keys:
                self.keys[block] = key
                self.held[key] = self.held.get(key, 0) + 1

    def removed(self, hashes: list[Any]) -> None:
        for block in hashes:
            key = self.keys.pop(_hashable(block), None)
            if key is not None:
                left = self.held.get(key, 0) - 1
                if left > 0:
                    self.held[key] = left
                else:
                    self.held.pop(key, None)

    def clear(self) -> None:
        self.keys.clear()
        self.held.clear()

    def match(self, token_ids: list[int]) -> int:
        """The leading tokens of ``token_ids`` the backend holds (whole blocks)."""
        size = self.block_size
        if not size:
            return 0
        key, matched = _ROOT, 0
        for start in range(0, len(token_ids) - size + 1, size):
            key = hash((key, tuple(token_ids[start:start + size])))
            if key not in self.held:
                break
            matched += size
        return matched

    def sequenced(self, seq: int) -> None:
        """Message ``seq`` arrived: after a gap, start over (what was lost may have removed blocks)."""
        if self.last_seq is not None and seq != self.last_seq + 1:
            self.gaps += 1
            self.clear()
            log.warning("KV events: sequence %d after %d; the index starts over", seq, self.last_seq)
        self.last_seq = seq


def _hashable(value: Any) -> Any:
    return bytes(value) if isinstance(value, (bytearray, memoryview)) else value


@dataclass
class KVEventSource:
    """One backend's event stream (its ``kv_events:`` endpoint) and the tokenizer that reads it."""

    backend: str
    endpoint: str
    tokenizer: str
    topic: str = ""
    index: BlockIndex = field(default_factory=BlockIndex)
    silent_since: float | None = None  # the first request served since the last message (time.monotonic())
    warned: bool = False

    def served(self, now: float | None = None) -> None:
        """Its backend served a request: a publisher silent for ``SILENCE_S`` since the first one is logged."""
        now = time.monotonic() if now is None else now
        if self.silent_since is None:
            self.silent_since = now
        elif not self.warned and now - self.silent_since >= SILENCE_S:
            self.warned = True
            log.warning("%s: no KV events on %s for %.0f s while it served requests; precise prefix routing "
                        "matches nothing. vLLM's publisher binds only tcp://*:PORT or ipc:// endpoints (with "
                        "tcp://127.0.0.1:PORT it connects, and publishes nowhere): start vLLM with tcp://*:PORT "
                        "and subscribe to tcp://HOST:PORT, or give both the same ipc:// path (a prompt shorter "
                        "than one KV block stores no block)", self.backend, self.endpoint, now - self.silent_since)

    def receive(self, frames: list[bytes]) -> None:
        """One ZMQ message: (topic, sequence, payload); a malformed one is logged and skipped."""
        self.silent_since, self.warned = None, False
        try:
            seq, payload = int.from_bytes(frames[-2], "big", signed=True), frames[-1]
            events = decode_batch(payload)
        except (IndexError, ValueError, msgspec.DecodeError) as exc:
            log.warning("%s: unreadable KV event message: %s", self.backend, exc)
            return
        self.index.sequenced(seq)
        for kind, fields in events:
            self.index.apply(kind, fields)

    async def run(self) -> None:
        """Subscribes until cancelled; reconnects are ZMQ's own."""
        import zmq
        import zmq.asyncio

        socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        socket.connect(self.endpoint)
        try:
            while True:
                self.receive(await socket.recv_multipart())
        finally:
            socket.close(linger=0)


def start_subscribers(sources: list[KVEventSource]) -> list[asyncio.Task]:
    return [asyncio.create_task(source.run(), name=f"kv-events {source.backend}") for source in sources]


def prompt_token_ids(request: Any, tokenizer: str) -> list[int]:
    """The request's prompt as the backend tokenizes it: a chat rendered with the chat template that
    goes with ``tokenizer`` (its GGUF's, or the ``tokenizer_config.json`` beside a ``tokenizer.json``),
    then encoded. Runs in a worker thread (``tokenizers`` releases the GIL while it encodes)."""
    from frontend.chat_format import render_chat
    from frontend.prompt_text import chat_spec
    from frontend.token_count import load_counter

    encoder = load_counter(tokenizer).tokenizer  # type: ignore[attr-defined]
    if request.is_chat:
        return list(encoder.encode(render_chat(chat_spec(tokenizer), request.messages or []),
                                   add_special_tokens=False).ids)
    if request.prompt_tokens is not None:
        return list(request.prompt_tokens)
    return list(encoder.encode((request.system or "") + (request.prompt or ""), add_special_tokens=True).ids)
