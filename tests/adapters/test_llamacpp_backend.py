"""The llama.cpp backend a runner serves (runner/worker.py): its contexts' keep-alive, cancellation and usage."""

from __future__ import annotations

import asyncio

import pytest

from core.base import Done, GenerationRequest
from adapters.engines.llamacpp.backend import LlamaCppBackend
from core.settings import LocalSettings


def run(coro):
    return asyncio.run(coro)


def chat(model: str, n: int, **kw) -> GenerationRequest:
    """``n`` tokens exactly: ``ignore_eos`` keeps the random-weight model from stopping early."""
    return GenerationRequest(model=model, messages=[{"role": "user", "content": "hi"}],
                             options={"num_predict": n, "seed": 3, "ignore_eos": True}, **kw)


def test_a_context_opened_for_other_options_closes_after_keep_alive_the_loaded_one_stays(tiny_store):
    """The runner's own context (``load``) lives as long as the runner, which the scheduler stops; one a
    request opened for other load options closes ``keep_alive`` after its last request."""
    async def go():
        backend = LlamaCppBackend(store=tiny_store, settings=LocalSettings(keep_alive=0.3))
        try:
            await backend.load("tiny", keep_alive=-1)
            [e async for e in backend.stream(chat("tiny", 2))]  # the loaded context: stays
            other = chat("tiny", 2)
            other.options["num_ctx"] = 256
            [e async for e in backend.stream(other)]
            assert sorted(m.context_length for m in await backend.loaded_models()) == [256, 512]
            await asyncio.sleep(0.6)
            assert [m.context_length for m in await backend.loaded_models()] == [512]
        finally:
            await backend.aclose()
    run(go())


def test_cancelling_ends_the_stream_with_the_usage_so_far(tiny_store):
    async def go():
        backend = LlamaCppBackend(store=tiny_store)
        try:
            request = chat("slow", 3000)
            events = backend.stream(request)
            for _ in range(3):
                await anext(events)
            request.cancel.cancel()
            rest = [e async for e in events]
            done = rest[-1]
            assert isinstance(done, Done) and done.finish_reason == "cancelled"
            assert 0 < done.usage.output_tokens < 3000 and done.usage.input_tokens > 0
            again = [e async for e in backend.stream(chat("slow", 2))]  # the slot is free again
            assert isinstance(again[-1], Done) and again[-1].usage.output_tokens == 2
        finally:
            await backend.aclose()
    run(go())


@pytest.mark.slow  # 1,200 tokens of llama.cpp: make test-slow (CI runs it)
def test_ignore_eos_generates_exactly_num_predict_tokens(tiny_store):
    async def go():
        backend = LlamaCppBackend(store=tiny_store)
        try:
            for seed in range(4):  # without the flag, some of these seeds stop at EOS early
                req = chat("slow", 300)
                req.options["seed"] = seed
                done = [e async for e in backend.stream(req)][-1]
                assert (done.finish_reason, done.usage.output_tokens) == ("length", 300)
        finally:
            await backend.aclose()
    run(go())


def test_every_llama_cpp_call_on_a_slot_runs_on_its_one_thread(tiny_store, monkeypatch):
    """Load (with llama.cpp's warm-up), generations one after another and at once, embeddings and the close of
    a slot all run on the slot's own thread: GNU OpenMP keeps a worker team per calling thread, and calls from
    a shared pool's threads in turn halved SmolLM2's decode on 2 cores for good (libgomp's throttled barriers
    once it has more threads than cores)."""
    import gc
    import threading
    import time

    import llama_cpp

    from adapters.engines.llamacpp import pool as pool_module

    gc.collect()  # earlier tests' leftover Llama objects close now, not recorded here from the collector's thread
    seen: list[tuple[str, int]] = []
    load, evaluate, close = pool_module._load, llama_cpp.Llama.eval, llama_cpp.Llama.close

    def record(kind, fn):
        def wrapper(*args, **kwargs):
            seen.append((kind, threading.get_ident()))
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(pool_module, "_load", record("load", load))
    monkeypatch.setattr(llama_cpp.Llama, "eval", record("eval", evaluate))
    monkeypatch.setattr(llama_cpp.Llama, "close", record("close", close))

    async def drain(backend):
        return [e async for e in backend.stream(chat("tiny", 4))]

    async def go():
        backend = LlamaCppBackend(store=tiny_store, settings=LocalSettings(num_parallel=1))
        try:
            for _ in range(3):
                await drain(backend)
            busy = asyncio.get_running_loop().run_in_executor(None, time.sleep, 0.5)  # other threads work meanwhile
            await drain(backend)
            await asyncio.gather(*(drain(backend) for _ in range(4)))
            await busy
        finally:
            await backend.aclose()
    run(go())
    kinds = {kind for kind, _ in seen}
    assert kinds == {"load", "eval", "close"}, kinds
    first_close = next(i for i, (kind, _) in enumerate(seen) if kind == "close")  # later ones: __del__, a no-op
    assert len({ident for _, ident in seen[: first_close + 1]}) == 1, sorted(set(seen))
