"""The scheduler's rules (adapters/engines/scheduler.py), over in-process stand-ins for runner processes:
load on first use, keep-alive, max_loaded_models, memory, unload after the requests in flight, and
the crash back-off. The processes themselves are tested in tests/runner/."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from core.errors import InvalidRequest, QueueFull, RunnerBackoff, RunnerStopped
from core.options import resolve_options
from core.settings import LocalSettings
from adapters.engines.scheduler import RunnerScheduler
from adapters.engines.store_models import model_details

_pids = itertools.count(1000)


class StandIn:
    """What the scheduler asks of a runner, without a process."""

    def __init__(self, engine: str, model: str):
        self.engine, self.model = engine, model
        self.pid = next(_pids)
        self.pids = [self.pid]
        self.context_length = 512
        self.failure = None
        self.on_exit = None
        self.load_stats = {}
        self.stopped = False

    def memory(self) -> int:
        return 1 << 20

    def kill(self, why: str) -> None:
        self.failure = why
        if self.on_exit is not None:
            self.on_exit(self, why)

    async def stop(self) -> None:
        self.stopped = True


class Starts:
    def __init__(self, fail: Exception | None = None, delay: float = 0.0):
        self.runners: list[StandIn] = []
        self.fail = fail
        self.delay = delay

    async def __call__(self, engine, details, options):
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        runner = StandIn(engine, details.name.display)
        self.runners.append(runner)
        return runner


@pytest.fixture
def models(tiny_store):
    return {name: model_details(tiny_store, name) for name in ("tiny", "tiny-go")}


def run(coro):
    return asyncio.run(coro)


def scheduler(starts: Starts, memory=None, **settings) -> RunnerScheduler:
    return RunnerScheduler(LocalSettings.model_validate(settings), starts, available_memory=memory or (lambda: None))


OPTS = resolve_options()


def test_a_runner_starts_on_first_use_and_serves_the_requests_after(models):
    async def go():
        starts = Starts()
        s = scheduler(starts)
        a, load_a = await s.acquire("llamacpp", models["tiny"], OPTS)
        b, load_b = await s.acquire("llamacpp", models["tiny"], resolve_options({"num_ctx": 64}))
        c, _ = await s.acquire("native", models["tiny"], OPTS)
        assert a is b and a is not c and len(starts.runners) == 2
        assert load_a > 0 and load_b == 0.0
        for entry in (a, b, c):
            await s.release(entry, None)
        await s.aclose()
        assert all(r.stopped for r in starts.runners)
    run(go())


def test_keep_alive_stops_an_idle_runner_and_minus_one_keeps_it(models):
    async def go():
        starts = Starts()
        s = scheduler(starts)
        a, _ = await s.acquire("llamacpp", models["tiny"], OPTS)
        b, _ = await s.acquire("llamacpp", models["tiny-go"], OPTS)
        await s.release(a, 0.05)
        await s.release(b, -1)
        assert a.expires_at == pytest.approx(time.time() + 0.05, abs=0.05) and b.expires_at is None
        await asyncio.sleep(0.15)
        assert [r.stopped for r in starts.runners] == [True, False]
        assert [e.name for e in s.runners()] == ["tiny-go:latest"]
        await s.aclose()
    run(go())


def test_max_loaded_models_stops_the_idle_runner_that_expires_first(models, tiny_store):
    async def go():
        starts = Starts()
        s = scheduler(starts, max_loaded_models=2)
        a, _ = await s.acquire("llamacpp", models["tiny"], OPTS)
        b, _ = await s.acquire("llamacpp", models["tiny-go"], OPTS)
        await s.release(a, 60)
        await s.release(b, 30)  # expires first
        c, _ = await s.acquire("native", models["tiny"], OPTS)
        assert [r.stopped for r in starts.runners] == [False, True, False]
        assert len(s.runners()) == 2
        await s.release(c, None)
        await s.aclose()
    run(go())


def test_at_the_limit_with_every_runner_busy_a_request_waits_for_one_to_be_idle(models):
    async def go():
        starts = Starts()
        s = scheduler(starts, max_loaded_models=1)
        a, _ = await s.acquire("llamacpp", models["tiny"], OPTS)
        waiting = asyncio.ensure_future(s.acquire("llamacpp", models["tiny-go"], OPTS))
        await asyncio.sleep(0.05)
        assert not waiting.done() and len(starts.runners) == 1  # never past the limit
        await s.release(a, None)
        b, _ = await asyncio.wait_for(waiting, 2)
        assert starts.runners[0].stopped and b.name == "tiny-go:latest" and len(s.runners()) == 1
        await s.release(b, None)
        await s.aclose()
    run(go())


def test_waiting_for_room_is_bounded_by_max_queue(models):
    async def go():
        s = scheduler(Starts(), max_loaded_models=1, max_queue=0)
        a, _ = await s.acquire("llamacpp", models["tiny"], OPTS)
        with pytest.raises(QueueFull):
            await s.acquire("llamacpp", models["tiny-go"], OPTS)
        await s.release(a, None)
        await s.aclose()
    run(go())


def test_idle_runners_stop_while_memory_is_short(models):
    async def go():
        free = {"bytes": 1 << 40}
        starts = Starts()
        s = scheduler(starts, memory=lambda: free["bytes"])
        a, _ = await s.acquire("llamacpp", models["tiny"], OPTS)
        await s.release(a, None)
        free["bytes"] = 1000  # less than tiny-go's weights
        b, _ = await s.acquire("llamacpp", models["tiny-go"], OPTS)
        assert starts.runners[0].stopped and len(starts.runners) == 2  # and it starts anyway when none is left
        await s.release(b, None)
        await s.aclose()
    run(go())


def test_unload_waits_for_the_requests_in_flight(models):
    async def go():
        starts = Starts()
        s = scheduler(starts)
        a, _ = await s.acquire("llamacpp", models["tiny"], OPTS)
        assert await s.unload(models["tiny"].digest) is True
        assert not starts.runners[0].stopped and a.unload_when_idle
        await s.release(a, None)
        await asyncio.sleep(0.01)
        assert starts.runners[0].stopped and s.runners() == []
        assert await s.unload(models["tiny"].digest) is False
        await s.aclose()
    run(go())


def test_crashes_in_a_row_back_off_and_a_finished_request_ends_the_streak(models):
    async def go():
        starts = Starts()
        s = scheduler(starts)
        for n in (1, 2):
            a, _ = await s.acquire("llamacpp", models["tiny"], OPTS)
            a.runner.kill("killed by SIGSEGV")
            await s.release(a, None, ok=False)
            await asyncio.sleep(0)
        assert s.runners() == [] and s.failures()[0].count == 2
        with pytest.raises(RunnerBackoff) as refused:
            await s.acquire("llamacpp", models["tiny"], OPTS)
        assert refused.value.status == 503 and 0 < refused.value.retry_after <= 1.0
        assert "crashed 2 times in a row (last: killed by SIGSEGV)" in refused.value.message
        s.crashes[("llamacpp", models["tiny"].digest)].retry_at = time.time()  # the second passed
        a, _ = await s.acquire("llamacpp", models["tiny"], OPTS)
        await s.release(a, None, ok=True)
        assert s.failures() == [] and len(starts.runners) == 3
        await s.aclose()
    run(go())


def test_a_runner_that_dies_while_loading_counts_as_a_crash_a_refusal_does_not(models):
    async def go():
        s = scheduler(Starts(fail=RunnerStopped("model runner has unexpectedly stopped (killed by SIGSEGV)")))
        with pytest.raises(RunnerStopped):
            await s.acquire("llamacpp", models["tiny"], OPTS)
        assert [f.count for f in s.failures()] == [1] and s.runners() == []
        s = scheduler(Starts(fail=InvalidRequest("no such architecture")))
        with pytest.raises(InvalidRequest):
            await s.acquire("llamacpp", models["tiny"], OPTS)
        assert s.failures() == [] and s.runners() == []
    run(go())


def test_requests_arriving_during_a_load_share_it(models):
    async def go():
        starts = Starts(delay=0.05)
        s = scheduler(starts)
        got = await asyncio.gather(*(s.acquire("llamacpp", models["tiny"], OPTS) for _ in range(5)))
        assert len({id(e) for e, _ in got}) == 1 and len(starts.runners) == 1 and got[0][0].active == 5
        for entry, _ in got:
            await s.release(entry, None)
        await s.aclose()
    run(go())


def test_infer_serve_and_llm_engine_from_model_share_the_engines_defaults():
    """One settings tree: the native knobs infer serve passes are only the ones set; the rest are
    EngineConfig's own, so the two entry points cannot drift apart again."""
    from adapters.engines.native.backend import engine_config
    from native_engine.config import EngineConfig

    served = engine_config(LocalSettings.model_validate({}).native, "m.gguf", 2048)
    direct = EngineConfig(model="m.gguf", max_model_len=2048)
    assert served == direct
    tuned = engine_config(LocalSettings.model_validate({"native": {"max_num_seqs": 8}}).native, "m.gguf", 2048)
    assert tuned.max_num_seqs == 8 and tuned.max_num_batched_tokens == direct.max_num_batched_tokens
