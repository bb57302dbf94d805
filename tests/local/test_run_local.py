"""``infer run --local`` is served by ``infer serve``'s stack: the one scheduler (keep-alive, max_loaded_models,
unload) over runners whose bodies run on threads of the CLI's process (``in_process_engines``). Driven through
``ChatSession``, the object ``infer run --local`` talks to, on the tiny models (tests/models.py)."""

from __future__ import annotations

import asyncio
import io
import os
import threading
import time

import pytest

from cli.chat_session import ChatSession
from core.errors import RunnerStopped
from core.settings import LocalSettings


def session(store, tmp_path, **settings) -> ChatSession:
    return ChatSession(store, "tiny", db_url=f"sqlite:///{tmp_path / 'usage.db'}", out=io.StringIO(),
                       settings=LocalSettings.model_validate({"keep_alive": 300, **settings}))


def runner_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("runner-")]


async def turn(s: ChatSession, text: str = "hi"):
    s.options = {"num_predict": 3, "seed": 1}
    s.messages.clear()
    return await s.send(text)


@pytest.mark.parametrize("engine", ["llamacpp", "native"])
def test_a_turn_loads_a_runner_in_this_process_and_keep_alive_0_stops_it_after_the_answer(tiny_store, tmp_path,
                                                                                              engine):
    async def go():
        s = session(tiny_store, tmp_path, engine=engine)
        try:
            done = await turn(s)
            assert done.finish_reason in ("stop", "length") and done.usage.output_tokens > 0
            (loaded,) = await s.engines.loaded_models()
            assert (loaded.name, loaded.backend, loaded.pid, loaded.state) == ("tiny:latest", engine, os.getpid(),
                                                                               "ready")
            assert loaded.expires_at == pytest.approx(time.time() + 300, abs=5)
            assert runner_threads() == [f"runner-{engine}"]
            s.keep_alive = 0  # --keepalive 0: the scheduler stops the runner once the answer is in
            await turn(s)
            for _ in range(100):
                if not await s.engines.loaded_models() and not runner_threads():
                    break
                await asyncio.sleep(0.05)
            assert await s.engines.loaded_models() == [] and runner_threads() == []
        finally:
            await s.aclose()
    asyncio.run(go())


def test_max_loaded_models_1_swaps_the_runner_when_another_model_is_loaded(tiny_store, tmp_path):
    async def go():
        s = session(tiny_store, tmp_path, engine="llamacpp", max_loaded_models=1)
        try:
            await turn(s)
            first = s.engines.scheduler.runners()[0].runner
            s.model = "tiny-go"  # /load tiny-go
            await turn(s)
            assert [m.name for m in await s.engines.loaded_models()] == ["tiny-go:latest"]
            assert not first.alive and runner_threads() == ["runner-llamacpp"]  # the first one ended
            s.model = "tiny"
            await turn(s)
            assert [m.name for m in await s.engines.loaded_models()] == ["tiny:latest"]
        finally:
            await s.aclose()
        assert runner_threads() == []
    asyncio.run(go())


def test_a_hung_in_process_runner_is_given_up_on_and_the_next_turn_starts_a_fresh_one(tiny_store, tmp_path):
    """The scripted engine's ``stall:N`` stops producing while its loop still answers pings: the hang
    watchdog gives the thread up (its socket shut down under it) and the turn fails with one line."""
    async def go():
        s = session(tiny_store, tmp_path, engine="scripted", test_engine=True, hang_timeout=0.5)
        try:
            with pytest.raises(RunnerStopped, match=r"\(hung: no event for .* check the log on this process.s stderr"):
                await turn(s, "stall:1")
            done = await turn(s)
            assert done.usage.output_tokens == 3
            assert [e.runner.failure for e in s.engines.scheduler.runners()] == [None]
        finally:
            await s.aclose()
        for _ in range(100):  # the stalled body saw its socket shut down and ended too
            if not runner_threads():
                break
            await asyncio.sleep(0.05)
        assert runner_threads() == []
    asyncio.run(go())
