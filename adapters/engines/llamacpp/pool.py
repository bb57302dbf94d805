"""A llama.cpp runner's contexts: opened on first use, up to ``num_parallel`` slots each.

A llama.cpp runner (``adapters/engines/runner/worker.py``, a process of ``infer serve`` or a thread of
``infer run --local``) serves one model; which runners run, and for how long, is the scheduler's
(``adapters/engines/scheduler.py``: the one keep-alive, ``max_loaded_models``, unloading). This pool holds
that model's contexts: the one the runner was loaded with (``pin``: open until the runner stops), the
embedding one, and one for each other set of load options a request brings (``Options.load_key``: context
size, batch, GPU layers). Those last ones close ``keep_alive`` after their last request (the request's, else
the settings'): the scheduler sees a runner, not its contexts, and a context's KV cache can be gigabytes.

A *slot* is one ``llama_cpp.Llama`` (its own context and KV cache; the weights are mmapped and
shared by the page cache). Every llama.cpp call on a slot (its load with llama.cpp's warm-up decode, each
generation, its embeddings, its close) runs on the slot's own thread. ggml's CPU backend computes in
OpenMP parallel regions, and GNU OpenMP keeps a team of worker threads per calling thread: a slot called
from the threads of a shared pool in turn leaves one idle team per thread, and once a process has more
OpenMP threads than cores libgomp stops spinning at its barriers (its "throttled" mode), which halved
SmolLM2's decode on 2 cores (149 -> 85 tok/s, for good, after one call from a second thread). A request takes a free slot, or opens a new one while the model has
fewer than ``num_parallel``, or waits in a bounded queue (``QueueFull`` when it is full). Tokens of
two requests never mix because a slot serves one request at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp

from core.errors import BackendUnavailable, QueueFull
from core.options import Options
from core.settings import LocalSettings

log = logging.getLogger(__name__)


@dataclass(eq=False)
class LoadedEntry:
    name: str
    path: Path
    digest: str
    options: Options
    embedding: bool
    lora_path: Path | None  # a GGUF LoRA adapter applied to every context of the model (Ollama's ADAPTER)
    slots: list[llama_cpp.Llama] = field(default_factory=list)
    free: list[llama_cpp.Llama] = field(default_factory=list)
    waiters: int = 0  # requests queued for a slot
    reserved: int = 0  # requests between lookup and holding a slot
    opening: int = 0  # slots being loaded
    active: int = 0  # requests holding (or loading) a slot
    pinned: bool = False  # the runner's own context: open until the pool closes
    expires_at: float | None = None  # wall clock
    timer: asyncio.TimerHandle | None = None
    load_seconds: float = 0.0
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def n_ctx(self) -> int:
        return min(self.slots[0].n_ctx(), len(self.slots[0].input_ids)) if self.slots else self.options.num_ctx


class ModelPool:
    def __init__(self, settings: LocalSettings):
        self.settings = settings
        self._threads: dict[int, ThreadPoolExecutor] = {}  # id(slot) -> the slot's own thread
        self._entries: dict[tuple, LoadedEntry] = {}
        self._lock = asyncio.Lock()
        self.poisoned = 0  # slots retired after a failed llama.cpp call
        self._retired: list[llama_cpp.Llama] = []  # kept, never freed

    def entries(self) -> list[LoadedEntry]:
        return [e for e in self._entries.values() if e.slots]

    async def acquire(self, name: str, path: Path, digest: str, options: Options, *, embedding: bool = False,
                      lora_path: Path | None = None, pin: bool = False) -> tuple[LoadedEntry, llama_cpp.Llama, float]:
        """Return (entry, slot, seconds spent loading) for a request; waits for a slot if needed. ``pin``:
        the model's contexts for these options stay open until the pool closes."""
        key = (name, digest, options.load_key(), embedding)
        async with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = LoadedEntry(name, path, digest, options, embedding, lora_path)
            entry.pinned = entry.pinned or pin
            entry.reserved += 1  # keeps the entry from expiring until this request holds a slot
            _cancel_timer(entry)
        try:
            slot = await self._wait_for_slot(entry)
        finally:
            entry.reserved -= 1
        if slot is not None:
            return entry, slot, 0.0
        return await self._open_slot(entry)

    async def _wait_for_slot(self, entry: LoadedEntry) -> llama_cpp.Llama | None:
        """A free slot, or None when the caller should open a new one; counts the request active."""
        async with entry.cond:
            while True:
                if entry.free:
                    entry.active += 1
                    return entry.free.pop()
                if len(entry.slots) + entry.opening < self._capacity(entry):
                    entry.active += 1
                    entry.opening += 1
                    return None
                if entry.waiters >= self.settings.max_queue:
                    raise QueueFull(entry.name)
                entry.waiters += 1
                try:
                    await entry.cond.wait()
                finally:
                    entry.waiters -= 1

    async def _open_slot(self, entry: LoadedEntry) -> tuple[LoadedEntry, llama_cpp.Llama, float]:
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llamacpp-slot")
            try:
                slot = await loop.run_in_executor(thread, _load, entry.path, entry.options, entry.embedding,
                                                  entry.lora_path)
            except BaseException:
                thread.shutdown(wait=False)
                raise
            self._threads[id(slot)] = thread
        except BaseException:
            async with entry.cond:
                entry.opening -= 1
                entry.active -= 1
                entry.cond.notify_all()
                if not entry.slots and not entry.active and not entry.waiters:
                    self._entries.pop(_key_of(self._entries, entry), None)
            raise
        seconds = time.perf_counter() - t0
        async with entry.cond:
            entry.opening -= 1
            entry.slots.append(slot)
        entry.load_seconds = entry.load_seconds or seconds
        return entry, slot, seconds

    def thread_of(self, slot: llama_cpp.Llama) -> ThreadPoolExecutor:
        """The slot's own thread: every llama.cpp call on it runs there (see the module docstring)."""
        return self._threads[id(slot)]

    def _capacity(self, entry: LoadedEntry) -> int:
        return 1 if entry.embedding else max(1, self.settings.num_parallel)

    async def release(self, entry: LoadedEntry, slot: llama_cpp.Llama, keep_alive: float | None) -> None:
        async with entry.cond:
            entry.free.append(slot)
            entry.active -= 1
            entry.cond.notify()
            if entry.active == 0 and entry.waiters == 0 and entry.reserved == 0:
                self._schedule_expiry(entry, self.settings.keep_alive if keep_alive is None else keep_alive)

    async def discard(self, entry: LoadedEntry, slot: llama_cpp.Llama) -> None:
        """Take a slot whose llama.cpp call failed out of service for good: never reused, and never
        freed either (freeing a context that llama_decode left broken crashes the process), so its
        memory is the price of staying up. The next request opens a fresh slot."""
        _disarm(slot)
        self._retired.append(slot)
        thread = self._threads.pop(id(slot), None)
        if thread is not None:
            thread.shutdown(wait=False)
        self.poisoned += 1
        log.error("llama.cpp context of %s failed; it is retired (%d retired so far) and a fresh one "
                  "will be loaded", entry.name, self.poisoned)
        async with entry.cond:
            if slot in entry.slots:
                entry.slots.remove(slot)
            entry.active -= 1
            entry.cond.notify()
            if not entry.slots and not entry.active and not entry.waiters and not entry.reserved:
                self._entries.pop(_key_of(self._entries, entry), None)

    def _schedule_expiry(self, entry: LoadedEntry, keep_alive: float) -> None:
        if keep_alive < 0 or entry.pinned:
            entry.expires_at = None
            return
        entry.expires_at = time.time() + keep_alive
        loop = asyncio.get_running_loop()
        entry.timer = loop.call_later(keep_alive, lambda: loop.create_task(self._expire(entry)))

    async def _expire(self, entry: LoadedEntry) -> None:
        async with entry.cond:
            if entry.active or entry.waiters or entry.reserved or (entry.expires_at or 0) > time.time() + 0.01:
                return
            await self._drop(entry)

    async def _drop(self, entry: LoadedEntry) -> None:
        _cancel_timer(entry)
        self._entries.pop(_key_of(self._entries, entry), None)
        slots, entry.slots, entry.free = entry.slots, [], []
        loop = asyncio.get_running_loop()
        for slot in slots:
            thread = self._threads.pop(id(slot))
            await loop.run_in_executor(thread, slot.close)
            thread.shutdown(wait=False)
        log.info("closed the llama.cpp contexts of %s", entry.name)

    async def aclose(self) -> None:
        for entry in list(self._entries.values()):
            await self._drop(entry)


def _key_of(entries: dict, entry: LoadedEntry):
    return next((k for k, v in entries.items() if v is entry), None)


def _cancel_timer(entry: LoadedEntry) -> None:
    if entry.timer is not None:
        entry.timer.cancel()
        entry.timer = None


def _load(path: Path, options: Options, embedding: bool, lora_path: Path | None = None) -> llama_cpp.Llama:
    threads = options.num_thread or os.cpu_count() or 1
    try:
        return llama_cpp.Llama(
            model_path=str(path), n_ctx=options.num_ctx,
            # An embedding input is decoded in one batch, so its batch must hold the whole context.
            n_batch=options.num_ctx if embedding else min(options.num_batch, options.num_ctx),
            n_ubatch=options.num_ctx if embedding else min(options.num_batch, options.num_ctx),
            n_threads=threads, n_threads_batch=threads, n_gpu_layers=options.num_gpu,
            use_mmap=options.use_mmap, embedding=embedding, verbose=False,
            lora_path=None if lora_path is None else str(lora_path),
        )
    except (ValueError, RuntimeError, OSError) as exc:
        raise BackendUnavailable(f"llama.cpp could not load {path.name}: {exc}") from None


def _disarm(slot: llama_cpp.Llama) -> None:
    """Forget the native frees that a Llama and its model, context and batch run on close/__del__
    (llama-cpp-python keeps them as ExitStack callbacks), so neither closing the pool nor garbage
    collection at exit frees the broken context."""
    for owner in (slot, getattr(slot, "_model", None), getattr(slot, "_ctx", None), getattr(slot, "_batch", None)):
        for name in ("_stack", "_exit_stack"):
            stack = getattr(owner, name, None)
            if stack is not None:
                stack.pop_all()

