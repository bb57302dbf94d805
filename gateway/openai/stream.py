"""Running the ``n`` generations of one OpenAI request, and the SSE chunk objects of a stream.

Each choice is a separate backend request through the recorder (one ledger row each). Streaming
primes the first generation before the response starts (so request errors become 4xx answers),
then runs all of them concurrently and interleaves their events by choice index.

Chat stream rules: the first chunk of a choice carries ``{"role": "assistant", "content": <first
non-empty text>}``; empty texts are never sent (their logprobs ride on the next chunk); the last
chunk of a choice has ``delta: {}`` and the ``finish_reason``; with ``stream_options.include_usage``
one more chunk with ``choices: []`` and the usage follows. Tool calls arrive whole: one chunk per call
with ``delta.tool_calls: [{index, id, type, function: {name, arguments}}]`` (``index`` counts the
choice's calls), and the choice then finishes with ``tool_calls`` (``stop`` after a call the request's
``tool_choice`` named, as OpenAI).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing

from core.base import Backend, Done, GenerationRequest, StreamEvent, TokenLogprob

from frontend.tools.wire import openai_call

from gateway.openai.responses import (ResponseMeta, Result, backend_fields, chat_logprobs, finish_reason,
                                     legacy_logprobs, usage)
from gateway.serving.recorder import Generation, Recorder

Events = AsyncIterator[tuple[int, StreamEvent]]


async def run_all(recorder: Recorder, backend: Backend, requests: Sequence[GenerationRequest],
                  route: str, gens: list[Generation] | None = None) -> list[Result]:
    """Non-streaming: every generation to the end; the first error (if any) is raised after all finish.
    ``gens`` collects the generations (their costs)."""
    async def one(req: GenerationRequest) -> Result:
        gen = await recorder.start(backend, req, route=route, stream=False)
        if gens is not None:
            gens.append(gen)
        return await gen.collect()

    if len(requests) == 1:  # the common case: no task of its own (a loop iteration less)
        return [await one(requests[0])]
    results = await asyncio.gather(*(one(r) for r in requests), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)  # type: ignore[arg-type]


async def start_stream(recorder: Recorder, backend: Backend, requests: Sequence[GenerationRequest],
                       route: str, gens: list[Generation] | None = None) -> tuple[Events, Callable[[], bool]]:
    """The events of every choice by index, and whether the next one is already here; ``gens``
    collects the generations as they start."""
    gens = [] if gens is None else gens
    first = await recorder.start(backend, requests[0], route=route, stream=True)
    gens.append(first)
    if len(requests) == 1:
        return first.indexed(0), first.more_ready
    return _merge(first, recorder, backend, requests[1:], route, gens), _never


def total_cost(gens: Sequence[Generation]) -> float | None:
    """What the generations cost together; None when their backend has no pricing."""
    costs = [g.cost_usd for g in gens if g.cost_usd is not None]
    return sum(costs) if costs else None


def _never() -> bool:
    return False


async def _merge(first: Generation, recorder: Recorder, backend: Backend,
                 rest: Sequence[GenerationRequest], route: str, gens: list[Generation]) -> Events:
    """The events of ``first`` and of the ``rest`` (started here), interleaved as they arrive."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, req: GenerationRequest | None) -> None:
        try:
            gen = first if req is None else await recorder.start(backend, req, route=route, stream=True)
            if req is not None:
                gens.append(gen)
            async with aclosing(gen.__aiter__()) as events:
                async for event in events:
                    queue.put_nowait(("event", index, event))
        except Exception as exc:
            queue.put_nowait(("error", index, exc))
        finally:
            queue.put_nowait(("end", index, None))

    tasks = [asyncio.create_task(pump(i, req)) for i, req in enumerate([None, *rest])]
    try:
        remaining = len(tasks)
        while remaining:
            kind, index, item = await queue.get()
            if kind == "end":
                remaining -= 1
            elif kind == "error":
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def with_cost(usage: dict, cost: float | None) -> dict:
    """The usage object with ``cost_usd`` (an extra field clients may ignore) when the backend is priced."""
    return usage if cost is None else {**usage, "cost_usd": round(cost, 12)}


def _take(pending: dict[int, list[TokenLogprob]], index: int) -> list[TokenLogprob]:
    return pending.pop(index, [])


async def chat_chunks(meta: ResponseMeta, events: Events, *, logprobs: bool,
                      include_usage: bool, cost: Callable[[], float | None] = lambda: None) -> AsyncIterator[dict]:
    started: set[int] = set()
    pending: dict[int, list[TokenLogprob]] = defaultdict(list)
    dones: dict[int, Done] = {}
    called: dict[int, int] = defaultdict(int)  # tool calls sent per choice
    # every chunk's keys, in order, built once per stream
    head = {**meta.envelope([], stream=True), **({"usage": None} if include_usage else {})}

    def chunk(index: int, delta: dict, reason: str | None = None, entries: list[TokenLogprob] | None = None,
              done: Done | None = None) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": chat_logprobs(entries) if entries else None,
                  "finish_reason": reason, **(backend_fields(done) if done is not None else {})}
        return {**head, "choices": [choice]}

    async for index, event in events:
        if isinstance(event, Done):
            dones[index] = event
            if index not in started:  # nothing was generated: the role still has to be announced
                started.add(index)
                yield chunk(index, {"role": "assistant"})
            reason = finish_reason(event, called=called[index] > 0, named=meta.named_call)
            yield chunk(index, {}, reason, _take(pending, index), event)
            continue
        if logprobs and event.logprobs:
            pending[index].extend(event.logprobs)
        if event.tool_calls:
            for delta in _call_deltas(event, called, index):
                if index not in started:
                    started.add(index)
                    delta = {"role": "assistant", **delta}
                yield chunk(index, delta, None, _take(pending, index))
            continue
        if event.thinking:  # reasoning in a chunk of its own, before the text (vLLM's reasoning_content)
            delta = {"reasoning_content": event.thinking}
            if index not in started:
                started.add(index)
                delta = {"role": "assistant", **delta}
            yield chunk(index, delta, None, _take(pending, index) if logprobs else None)
        if not event.text:
            continue
        delta = {"content": event.text}
        if index not in started:
            started.add(index)
            delta = {"role": "assistant", **delta}
        yield chunk(index, delta, None, _take(pending, index) if logprobs else None)
    if include_usage:
        yield {**meta.envelope([], stream=True), "usage": with_cost(usage([dones[i] for i in sorted(dones)]), cost())}


def _call_deltas(event, called: dict[int, int], index: int) -> list[dict]:
    """The deltas of a chunk with tool calls: its text, then one delta per call (numbered per choice)."""
    deltas: list[dict] = [{"content": event.text}] if event.text else []
    for call in event.tool_calls:
        deltas.append({"tool_calls": [openai_call(call, called[index])]})
        called[index] += 1
    return deltas


async def completion_chunks(meta: ResponseMeta, events: Events, prompt_of: Sequence[int], *, logprobs: bool,
                            include_usage: bool, cost: Callable[[], float | None] = lambda: None) -> AsyncIterator[dict]:
    pending: dict[int, list[TokenLogprob]] = defaultdict(list)
    offsets: dict[int, int] = defaultdict(int)
    dones: dict[int, Done] = {}
    # every chunk's keys, in order, built once per stream
    head = {**meta.envelope([], stream=True), **({"usage": None} if include_usage else {})}

    def chunk(index: int, text: str, reason: str | None = None, done: Done | None = None) -> dict:
        entries = _take(pending, index)
        lp = None
        if entries:
            lp = legacy_logprobs(entries, offsets[index])
            offsets[index] += sum(len(e.token) for e in entries)
        choice = {"index": index, "text": text, "logprobs": lp, "finish_reason": reason,
                  **(backend_fields(done) if done is not None else {})}
        return {**head, "choices": [choice]}

    async for index, event in events:
        if isinstance(event, Done):
            dones[index] = event
            yield chunk(index, "", finish_reason(event), event)
            continue
        if logprobs and event.logprobs:
            pending[index].extend(event.logprobs)
        if event.text:
            yield chunk(index, event.text)
    if include_usage:
        body = meta.envelope([], stream=True)
        body["usage"] = with_cost(usage([dones[i] for i in sorted(dones)], [prompt_of[i] for i in sorted(dones)]),
                                  cost())
        yield body
