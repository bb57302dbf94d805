"""A vLLM-compatible fake backend whose latency follows a continuous-batching queueing model.

The wire is the fake vLLM server's (``/v1/chat/completions`` and ``/v1/completions``, streamed with
``stream_options.include_usage`` or not, ``/v1/models``, ``/health``, Prometheus ``/metrics`` with
``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``); the text is
:class:`~.engine.FakeEngine`'s (prompt tokens = words of the rendered chat, output length = ``max_tokens``
unless a stop string ends it). Timing comes from one :class:`Engine` loop per server:

- requests join a FIFO queue; at each step boundary the queue's head enters the batch while fewer than
  ``batch_limit`` sequences are in it;
- a step is a **prefill** when a sequence in the batch is not yet prefilled (the oldest one; it lasts
  ``uncached prompt tokens / prefill_tok_s`` and yields that sequence's first token at its end;
  decoding waits),
  else a **decode** step: every sequence in the batch gets one token, and the step lasts
  ``tpot(n) = (tpot_base_ms + tpot_slope_ms * n) / 1000`` s for ``n`` sequences;
- a sequence leaves the batch at the end of the step that produced its last token, or at the next
  boundary after its client left (vLLM's abort).

**Prefix cache** (``prefix_cache_tokens`` > 0, vLLM's automatic prefix caching): the prompt's tokens
(the words of the rendered chat) are cut into blocks of ``block_size``, each keyed by a hash chained
over the blocks before it; when a sequence enters the batch, its leading blocks found in the cache are
cached tokens (at most all but the last prompt token, as vLLM computes at least one), which it does not
prefill; at the end of its prefill all its whole blocks are put in the cache, most recently used, the
first block last (so a shared prefix outlives each prompt's tail), and the least recently used blocks
beyond ``prefix_cache_tokens`` are evicted. Usage reports ``prompt_tokens_details.cached_tokens`` (vLLM
with ``--enable-prompt-tokens-details``), ``/metrics`` ``vllm:prefix_cache_queries`` and
``vllm:prefix_cache_hits`` (tokens) and ``vllm:cache_config_info`` (``num_gpu_blocks`` × ``block_size``
= ``kv_tokens``). Generated tokens are not cached. With ``kv_events_port`` the cache publishes
vLLM's KV events (``fakes/kv_events.py``): a ``BlockStored`` per run of new blocks with their token
ids (``tokenizer``: a WordLevel ``tokenizer.json`` mapping the words to ids), a ``BlockRemoved`` per
eviction.

So an idle server answers a lone request with TTFT = P / prefill_tok_s and TPOT = tpot(1); steps are
scheduled on absolute times, so a late wake-up is caught up and long runs keep the model's averages.

Faults: ``fail_status`` (the next ``fail_times`` requests, or every request while it is set when
``fail_times`` is None, get vLLM's error body with that status, plus ``Retry-After`` = ``retry_after`` on
429/503); ``stall_first_token`` (the 200 and SSE headers go out, then nothing until the client leaves;
the sequence never enters the queue; ``stall_times`` limits it to that many requests); ``healthy``.

    server = start_queueing(QueueModel(batch_limit=4, prefill_tok_s=2000, tpot_base_ms=20, tpot_slope_ms=5))
    server.model.fail_status = 503            # mutable between requests
    server.engine.records                     # one Record per finished or aborted request

    python -m fakes.queueing --port 8001 --batch-limit 4 --prefill-tok-s 2000 --tpot-base-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from . import vllm
from .behaviour import Behaviour
from .common import Reply, json_reply, text_reply
from .engine import FakeEngine, Generation
from .kv_events import KVEventPublisher, WordVocab
from .openai_wire import Style, full_body, stream_wire
from .runner import RunningServer

MAX_CATCH_UP_S = 0.05  # a step later than this (a stalled event loop) restarts the schedule from now


@dataclass
class QueueModel:
    """The backend's queueing model and its faults; fields may change between requests."""

    batch_limit: int = 8              # sequences decoded together; the rest wait FIFO
    prefill_tok_s: float = 2000.0     # prompt tokens per second, one sequence at a time
    tpot_base_ms: float = 20.0        # a decode step lasts tpot_base_ms + tpot_slope_ms * n
    tpot_slope_ms: float = 2.0
    kv_tokens: int = 0                # KV cache size in tokens for kv_cache_usage_perc; 0: batch_limit * 2048
    prefix_cache_tokens: int = 0      # prefix cache size in tokens; 0: no prefix caching
    cached_prefill_weight: float = 0.0  # a cached prompt token's prefill time, as a share of an uncached one's
    block_size: int = 16              # tokens per cached block
    kv_events_port: int = 0           # publish vLLM's KV events on tcp://127.0.0.1:PORT (0: off)
    tokenizer: str = ""               # a WordLevel tokenizer.json giving the words' token ids (else CRC-32s)
    model: str = "queueing"           # the served model name
    fail_status: int | None = None
    fail_times: int | None = None     # None: every request while fail_status is set
    fail_message: str = "simulated failure"
    retry_after: str | None = None
    stall_first_token: bool = False
    stall_times: int | None = None    # None: every request while stall_first_token is set
    healthy: bool = True

    def __post_init__(self) -> None:
        if self.batch_limit < 1 or self.prefill_tok_s <= 0 or self.tpot_base_ms < 0 or self.tpot_slope_ms < 0:
            raise ValueError(f"bad queueing model: {self}")
        self.kv_tokens = self.kv_tokens or self.batch_limit * 2048

    def tpot(self, n: int) -> float:
        """Seconds of one decode step of ``n`` sequences."""
        return (self.tpot_base_ms + self.tpot_slope_ms * n) / 1000

    def prefill(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        return (prompt_tokens - cached_tokens + self.cached_prefill_weight * cached_tokens) / self.prefill_tok_s

    def take_failure(self) -> int | None:
        status = self.fail_status
        if status is not None and self.fail_times is not None:
            self.fail_times -= 1
            if self.fail_times <= 0:
                self.fail_status, self.fail_times = None, None
        return status

    def take_stall(self) -> bool:
        stall = self.stall_first_token
        if stall and self.stall_times is not None:
            self.stall_times -= 1
            if self.stall_times <= 0:
                self.stall_first_token, self.stall_times = False, None
        return stall


@dataclass
class Record:
    """One request as the engine saw it; times are ``time.monotonic()`` seconds."""

    index: int                        # arrival order
    request_id: str | None            # the x-request-id header
    prompt_tokens: int
    max_output: int
    arrival: float
    admitted: float | None = None     # entered the batch
    first_token: float | None = None
    finished: float | None = None
    produced: int = 0
    aborted: bool = False
    batch_at_admit: int = 0           # sequences in the batch just after it entered
    finish_reason: str = "length"     # for vllm:request_success_total
    cached_tokens: int = 0            # prompt tokens found in the prefix cache when it entered the batch


class PrefixCache:
    """Chained block hashes in LRU order, at most ``capacity`` blocks (the module docstring); with a
    ``publisher``, vLLM's KV events for the blocks stored and evicted."""

    def __init__(self, capacity_tokens: int, block_size: int, publisher: KVEventPublisher | None = None):
        self.block_size, self.capacity = block_size, capacity_tokens // block_size
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = self.hits = 0  # tokens, as vLLM's counters
        self.publisher = publisher

    def keys(self, words: list[str]) -> list[int]:
        key, keys = 0, []
        for start in range(0, len(words) - self.block_size + 1, self.block_size):
            key = hash((key, tuple(words[start:start + self.block_size])))
            keys.append(key)
        return keys

    def lookup(self, keys: list[int], prompt_tokens: int) -> int:
        matched = 0
        for key in keys:
            if key not in self.blocks:
                break
            matched += 1
        cached = min(matched * self.block_size, max(0, prompt_tokens - 1))
        self.queries += prompt_tokens
        self.hits += cached
        return cached

    def store(self, keys: list[int], tokens: list | None = None) -> None:
        """``keys`` (of ``tokens``, for the events) are used now; evicts past the capacity."""
        events = self._stored_events(keys, tokens) if self.publisher is not None else []
        for key in reversed(keys):
            self.blocks[key] = None
            self.blocks.move_to_end(key)
        evicted = []
        while len(self.blocks) > self.capacity:
            evicted.append(self.blocks.popitem(last=False)[0])
        if self.publisher is not None:
            self.publisher.publish(events + ([["BlockRemoved", evicted, "GPU"]] if evicted else []))

    def _stored_events(self, keys: list[int], tokens: list | None) -> list[list]:
        """One BlockStored per run of blocks not held yet, with the block before the run as parent."""
        events, size, run = [], self.block_size, []
        for i, key in enumerate(keys + [None]):
            if key is not None and key not in self.blocks:
                run.append(i)
                continue
            if run:
                ids = (tokens or [])[run[0] * size:(run[-1] + 1) * size]
                parent = keys[run[0] - 1] if run[0] else None
                events.append(self.publisher.stored([keys[j] for j in run], parent, list(ids), size))
                run = []
        return events


@dataclass(eq=False)
class Sequence:
    record: Record
    tokens: asyncio.Queue = field(default_factory=asyncio.Queue)  # token indices, then None
    keys: list[int] = field(default_factory=list)  # the prompt's block keys (prefix caching)
    ids: list[int] = field(default_factory=list)   # the prompt's token ids
    is_prefilled: bool = False
    is_done: bool = False

    @property
    def context(self) -> int:
        return self.record.prompt_tokens + self.record.produced


class Engine:
    """The step loop; runs on the server's event loop (started by the first request)."""

    def __init__(self, model: QueueModel, max_records: int = 100_000):
        self.model = model
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.records: deque[Record] = deque(maxlen=max_records)
        self.arrivals = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.success: dict[str, int] = {}  # finish reason: finished requests (not aborted)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._clock = 0.0  # scheduled end of the last step
        publisher = KVEventPublisher(model.kv_events_port) if model.kv_events_port else None
        self.cache = (PrefixCache(model.prefix_cache_tokens, model.block_size, publisher)
                      if model.prefix_cache_tokens else None)
        self.vocab = WordVocab(model.tokenizer)

    @property
    def kv_usage(self) -> float:
        return min(1.0, sum(s.context for s in self.running) / self.model.kv_tokens)

    def submit(self, prompt_tokens: int, max_output: int, request_id: str | None = None,
               finish_reason: str = "length", words: list[str] | None = None) -> Sequence:
        """``words``: the prompt's tokens, for the prefix cache."""
        record = Record(self.arrivals, request_id, prompt_tokens, max_output, time.monotonic(),
                        finish_reason=finish_reason)
        self.arrivals += 1
        seq = Sequence(record)
        if self.cache is not None and words:
            seq.ids = self.vocab.ids(words)
            seq.keys = self.cache.keys(seq.ids)
        self.waiting.append(seq)
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()
        return seq

    def abort(self, seq: Sequence) -> None:
        """The client left: drop it from the queue now, from the batch at the next boundary."""
        if seq.is_done:
            return
        seq.record.aborted = True
        if seq in self.waiting:
            self.waiting.remove(seq)
            self._finish(seq)

    async def _run(self) -> None:
        while True:
            self._retire()
            self._admit()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            pending = next((s for s in self.running if not s.is_prefilled and not s.record.aborted), None)
            if pending is not None:
                await self._step(self.model.prefill(pending.record.prompt_tokens, pending.record.cached_tokens))
                self._prefilled(pending)
            else:
                batch = [s for s in self.running if not s.record.aborted]
                await self._step(self.model.tpot(len(batch)))
                for seq in batch:
                    self._emit(seq)
            self._retire()

    async def _step(self, duration: float) -> None:
        now = time.monotonic()
        start = self._clock if now - self._clock < MAX_CATCH_UP_S else now
        self._clock = start + duration
        await asyncio.sleep(max(0.0, self._clock - time.monotonic()))

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.model.batch_limit:
            seq = self.waiting.popleft()
            if not self.running:  # the engine was idle: the schedule starts now
                self._clock = time.monotonic()
            seq.record.admitted = time.monotonic()
            if self.cache is not None:
                seq.record.cached_tokens = self.cache.lookup(seq.keys, seq.record.prompt_tokens)
            self.running.append(seq)
            seq.record.batch_at_admit = len(self.running)

    def _prefilled(self, seq: Sequence) -> None:
        seq.is_prefilled = True
        self.prompt_tokens_total += seq.record.prompt_tokens
        if self.cache is not None:
            self.cache.store(seq.keys, seq.ids)
        if seq.record.max_output > 0 and not seq.record.aborted:
            self._emit(seq)

    def _emit(self, seq: Sequence) -> None:
        if seq.record.aborted or seq.record.produced >= seq.record.max_output:
            return
        now = time.monotonic()
        if seq.record.produced == 0:
            seq.record.first_token = now
        seq.tokens.put_nowait(seq.record.produced)
        seq.record.produced += 1
        self.generation_tokens_total += 1

    def _retire(self) -> None:
        for seq in [s for s in self.running if s.record.aborted
                    or (s.is_prefilled and s.record.produced >= s.record.max_output)]:
            self.running.remove(seq)
            self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        seq.is_done = True
        seq.record.finished = time.monotonic()
        seq.tokens.put_nowait(None)
        self.records.append(seq.record)
        if not seq.record.aborted:
            reason = seq.record.finish_reason
            self.success[reason] = self.success.get(reason, 0) + 1

    async def tokens(self, seq: Sequence) -> AsyncIterator[int]:
        """Token indices as the engine produces them; aborts the sequence if the consumer stops early."""
        try:
            while (index := await seq.tokens.get()) is not None:
                yield index
        finally:
            self.abort(seq)


# ---------------------------------------------------------------- HTTP


class QueueingApp:
    """The Starlette routes over one Engine; ``behaviour`` carries what :class:`~.common.Reply` needs."""

    def __init__(self, model: QueueModel):
        self.model, self.engine = model, Engine(model)
        self.behaviour = Behaviour(models=[model.model])

    def error(self, status: int, message: str, param: str | None = None) -> Reply:
        headers = {"retry-after": self.model.retry_after} if self.model.retry_after and status in (429, 503) else {}
        return json_reply(self.behaviour, vllm.error_body(status, message, param), status, headers)

    def completions(self, chat: bool):
        async def endpoint(request: Request) -> Reply:
            try:
                body = json.loads(await request.body())
            except ValueError:
                body = None
            self.behaviour.models = [self.model.model]
            status = self.model.take_failure()
            if status is not None:
                return self.error(status, self.model.fail_message)
            found = vllm.problem(body, chat, self.behaviour)
            if found:
                return self.error(*found)
            gen = vllm.run(body, chat)
            style = Style(chat, body.get("model") or self.model.model)
            if self.model.take_stall():
                return Reply(self.behaviour, 200, {"content-type": vllm.SSE}, _stall())
            words = FakeEngine.render(body["messages"] if chat else str(body["prompt"])).split()
            seq = self.engine.submit(gen.prompt_tokens, len(gen.tokens), request.headers.get("x-request-id"),
                                     gen.finish_reason, words)
            if body.get("stream"):
                return self.stream(style, gen, seq, body)
            return await self.whole(style, gen, seq)

        return endpoint

    def stream(self, style: Style, gen: Generation, seq: Sequence, body: dict[str, Any]) -> Reply:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        wire = stream_wire(style, gen, include_usage, None, b"")

        async def chunks() -> AsyncIterator[bytes]:
            async for index in self.engine.tokens(seq):
                yield wire.token(index)
            self.cached_usage(style, seq)
            yield wire.finish()

        return Reply(self.behaviour, 200, {"content-type": vllm.SSE}, chunks())

    def cached_usage(self, style: Style, seq: Sequence) -> None:
        if self.engine.cache is not None:
            style.usage_extra["prompt_tokens_details"] = {"cached_tokens": seq.record.cached_tokens}

    async def whole(self, style: Style, gen: Generation, seq: Sequence) -> Reply:
        async for _ in self.engine.tokens(seq):
            pass
        self.cached_usage(style, seq)
        return json_reply(self.behaviour, full_body(style, gen, True))

    def metrics_text(self) -> str:
        labels = f'{{engine="0",model_name="{self.model.model}"}}'
        gauges = [("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                   len(self.engine.running)),
                  ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                   len(self.engine.waiting)),
                  ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                   self.engine.kv_usage),
                  ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.",
                   self.engine.prompt_tokens_total),
                  ("vllm:generation_tokens", "counter", "Number of generation tokens processed.",
                   self.engine.generation_tokens_total)]
        if self.engine.cache is not None:
            gauges += [("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of "
                        "queried tokens.", self.engine.cache.queries),
                       ("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens.",
                        self.engine.cache.hits)]
        lines = []
        for name, kind, help_text, value in gauges:
            sample = f"{name}_total" if kind == "counter" else name
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{sample}{labels} {float(value)}"]
        lines += ["# HELP vllm:request_success Count of successfully processed requests.",
                  "# TYPE vllm:request_success counter"]
        for reason, count in sorted(self.engine.success.items()):
            lines.append(f'vllm:request_success_total{{engine="0",finished_reason="{reason}",'
                         f'model_name="{self.model.model}"}} {float(count)}')
        lines += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                  "# TYPE vllm:cache_config_info gauge",
                  f'vllm:cache_config_info{{block_size="{self.model.block_size}",enable_prefix_caching='
                  f'"{bool(self.engine.cache)}",engine="0",'
                  f'num_gpu_blocks="{self.cache_tokens // self.model.block_size}"}} 1.0']
        return "\n".join(lines) + "\n"

    @property
    def cache_tokens(self) -> int:
        """The KV cache's size as ``cache_config_info`` reports it: the prefix cache's, when on."""
        return self.model.prefix_cache_tokens or self.model.kv_tokens

    def routes(self) -> list[Route]:
        b = self.behaviour

        async def models(_: Request) -> Reply:
            card = {"id": self.model.model, "object": "model", "created": 0, "owned_by": "vllm",
                    "root": self.model.model, "parent": None, "max_model_len": vllm.MAX_MODEL_LEN, "permission": []}
            return json_reply(b, {"object": "list", "data": [card]})

        async def health(_: Request) -> Reply:
            return text_reply(b, "", 200 if self.model.healthy else 503)

        async def metrics(_: Request) -> Reply:
            return text_reply(b, self.metrics_text(), content_type="text/plain; version=0.0.4; charset=utf-8")

        return [Route("/v1/chat/completions", self.completions(chat=True), methods=["POST"]),
                Route("/v1/completions", self.completions(chat=False), methods=["POST"]),
                Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics)]

    def app(self) -> Starlette:
        return Starlette(routes=self.routes())


async def _stall() -> AsyncIterator[bytes]:
    await asyncio.Event().wait()  # until the client leaves (Reply cancels this)
    yield b""


def start_queueing(model: QueueModel | None = None) -> RunningServer:
    """A started in-process server (``url``, ``model``, ``engine``, ``stop()``; a context manager)."""
    qapp = QueueingApp(model or QueueModel())
    server = RunningServer("queueing", qapp.app(), qapp.behaviour)
    server.model, server.engine = qapp.model, qapp.engine
    return server.start()


# ---------------------------------------------------------------- subprocess


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, QueueModel]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    kinds = {"int": int, "float": float, "str": str, "bool": lambda v: v.lower() in ("1", "true", "yes")}
    for f in fields(QueueModel):
        kind = str(f.type).split(" | ")[0]
        parser.add_argument("--" + f.name.replace("_", "-"), type=kinds[kind], default=f.default)
    args = parser.parse_args(argv)
    model = QueueModel(**{f.name: getattr(args, f.name) for f in fields(QueueModel)})
    return args, model


def main(argv: list[str] | None = None) -> None:
    args, model = parse_args(argv)
    uvicorn.run(QueueingApp(model).app(), host=args.host, port=args.port, log_level="warning",
                access_log=False, timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
