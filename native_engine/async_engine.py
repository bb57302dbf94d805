"""Runs one `LLMEngine` on a background thread for asyncio callers.

Requests and aborts are queued and applied by the engine thread between steps, so callers
never wait for a forward pass; each request's outputs reach its own asyncio queue through
`loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .output import RequestOutput
from .sampling_params import SamplingParams


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue

    def put(self, item: object) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class AsyncLLMEngine:
    def __init__(self, engine) -> None:  # engine: LLMEngine
        self.engine = engine
        self._streams: dict[str, _Stream] = {}
        self._commands: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="native-engine", daemon=True)
        self._thread.start()

    async def generate(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                       priority: int = 0, arrival_time: float | None = None,
                       lora_request=None) -> AsyncIterator[RequestOutput]:
        """Outputs of one request as the engine produces them; closing the iterator aborts it."""
        if self._stopped:
            raise RuntimeError("the engine has been shut down")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[request_id] = stream
        self._submit(("add", request_id, prompt, params, priority, arrival_time, lora_request))
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._submit(("abort", request_id))

    def _submit(self, command: tuple) -> None:
        self._commands.append(command)
        self._wake.set()

    def _apply(self, command: tuple) -> None:
        kind, request_id, *args = command
        if kind == "abort":
            self.engine.abort(request_id)
            return
        try:
            self.engine.add_request(request_id, *args)
        except Exception as exc:  # a bad request fails alone
            if stream := self._streams.get(request_id):
                stream.put(exc)

    def _run(self) -> None:
        while not self._stopped:
            while self._commands:
                self._apply(self._commands.popleft())
            if not self.engine.has_unfinished_requests():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:
                self._fail_all(exc)
                continue
            for output in outputs:
                if stream := self._streams.get(output.request_id):
                    stream.put(output)

    def _fail_all(self, exc: Exception) -> None:
        for request_id, stream in list(self._streams.items()):
            self.engine.abort(request_id)
            stream.put(exc)

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=10)
        self.engine.close()  # a tensor-parallel group's ranks unload the model (or exit)
