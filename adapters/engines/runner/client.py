"""The gateway's handle on one runner: its process(es), its sockets, its requests in flight.

:func:`start_runner` starts ``python -m adapters.engines.runner`` for an engine and returns a
:class:`RunnerClient` at once; the process imports its engine while the gateway does other work.
:meth:`RunnerClient.load` loads a model into it. :meth:`RunnerClient.stream` sends one request and
yields its ``Chunk`` events and its ``Done``; :meth:`RunnerClient.embed` likewise.

Faults are the gateway's to notice, never the runner's to report:

- the process exits (SIGSEGV, SIGKILL by the OOM killer, an abort in native code): a pidfd on the
  event loop fires at once; every request in flight ends with :class:`~core.errors.RunnerStopped` (502 before
  the first byte; mid-stream the error carries ``partial``, the ``Done`` of what had arrived), and
  ``on_exit`` tells the scheduler;
- the runner has work but sends no event for ``hang_timeout`` seconds: it is killed, and the same follows.

A runner is a group of processes: one, or one per rank for a tensor-parallel model (``Launch.group``:
rank 0 is the runner and owns the channel, ``channel.py``: an inherited Unix socket; ranks 1..N-1 are
the native engine's workers, ``python -m native_engine.distributed.worker``, which meet rank 0 through
``torch.distributed``). The death of any member fails the group: the others are killed, every request
in flight ends with :class:`~core.errors.RunnerStopped`, and the scheduler starts a fresh group
on the next request.

``infer run --local`` runs the same runner body on a thread of its own process instead
(``Launch.in_process``, :class:`RunnerThread`): the same socket pair, messages and client, so the scheduler,
the front end and the wire are one code for both; only what a process gives is missing (a crash in the
engine takes the CLI down with it, as it would any in-process engine; see :class:`RunnerThread`).

A runner imports only the project and its installed packages, never the server's working directory:
each process starts as ``python -P -m …`` (no current directory on ``sys.path``) with the project's
root first on ``PYTHONPATH`` (``isolated``), so a ``gguf.py`` or ``torch.py`` lying where
``infer serve`` was started is not what a runner runs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import subprocess
import sys
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.base import Chunk, Done, EmbedResult, GenerationRequest, StreamEvent, Timings, Usage
from core.errors import BackendError, RunnerStopped
from adapters.engines.llamacpp import markers

from . import protocol as p
from .channel import Channel

log = logging.getLogger(__name__)

STOPPED = ("model runner has unexpectedly stopped ({why}); this may be due to resource limitations or an "
           "internal error, check the {log} for details")
LOGS = {False: "infer serve log", True: "log on this process's stderr"}  # by Launch.in_thread


PROJECT_ROOT = Path(__file__).resolve().parents[3]  # the folder holding adapters/, native_engine/, …


def isolated(module: str, *args: str) -> list[str]:
    """``python -P -m module args``: the current directory is not put on the child's ``sys.path``."""
    return [sys.executable, "-P", "-m", module, *args]


def isolated_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the project's root first on ``PYTHONPATH``, and no relative entries (they would
    name the working directory again)."""
    kept = [entry for entry in base.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(entry)]
    return {**base, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), *kept])}


@dataclass
class Launch:
    """How to start a runner's processes: one command per rank; ``{fd}`` in rank 0's is the channel's
    file descriptor, which that process inherits."""

    engine: str
    commands: list[list[str]] = field(default_factory=list)
    env: dict[str, str] | None = None
    in_thread: bool = False  # the runner's body on a thread of this process (no commands)

    @classmethod
    def in_process(cls, engine: str) -> "Launch":
        """The runner's body on a thread of this process (``infer run --local``): :class:`RunnerThread`."""
        return cls(engine, in_thread=True)

    @classmethod
    def single(cls, engine: str, *, log_level: str = "warning") -> "Launch":
        """One runner process; a llama.cpp one with the library the installer found it needs preloaded
        (``adapters/engines/llamacpp/markers.py``), if any."""
        preload = markers.preload_env(os.environ) if engine == "llamacpp" else None
        env = isolated_env(preload or os.environ)
        return cls(engine, [isolated("adapters.engines.runner", "--engine", engine, "--fd", "{fd}",
                                     "--parent", str(os.getpid()), "--log-level", log_level)], env)

    @classmethod
    def group(cls, engine: str, world_size: int, init_method: str, *, device: str = "auto",
              log_level: str = "warning") -> "Launch":
        """A tensor-parallel group: the runner as rank 0, then a native-engine worker per rank, all meeting at
        ``init_method`` (the runner's engine is told the same place through its settings)."""
        workers = [isolated("native_engine.distributed.worker", "--rank", str(rank), "--world-size",
                            str(world_size), "--init-method", init_method, "--device", device,
                            "--parent", str(os.getpid()), "--log-level", log_level) for rank in range(1, world_size)]
        rank0 = cls.single(engine, log_level=log_level)
        return cls(engine, [rank0.commands[0], *workers], rank0.env)


class _Gone:
    """Put on a request's queue when its runner died."""

    def __init__(self, why: str):
        self.why = why


_ids = itertools.count(1)


class RunnerClient:
    def __init__(self, launch: Launch, *, hang_timeout: float, ping_every: float = 2.0):
        self.engine = launch.engine
        self.hang_timeout = hang_timeout
        self.ping_every = ping_every
        self.on_exit: Callable[["RunnerClient", str], None] | None = None
        self.failure: str | None = None  # why it stopped, once it did
        self.context_length = 0
        self.load_stats: dict[str, float] = {}
        self.spec_decode: dict[str, dict] = {}  # the model's speculative decoding counters, as last reported
        self.started = time.time()
        self._pending: dict[int, asyncio.Queue | asyncio.Future] = {}
        self._last_event = time.monotonic()
        self._stopping = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if launch.in_thread:
            self.processes: list[subprocess.Popen | RunnerThread] = [RunnerThread(launch.engine, theirs.detach())]
        else:
            try:
                self.processes = [_spawn(command, launch.env, theirs if rank == 0 else None)
                                  for rank, command in enumerate(launch.commands)]
            finally:
                theirs.close()
        loop = asyncio.get_running_loop()
        self._channel: Channel | None = None
        self._opening = loop.create_task(Channel.open(ours, p.from_runner, self._received))
        self._opening.add_done_callback(self._opened)
        self._exit_fds = [_watch_exit(loop, proc, self._exited) for proc in self.processes]
        self._tasks = [self._opening, loop.create_task(self._watchdog())]

    def _stopped(self, why: str | None) -> str:
        return STOPPED.format(why=why, log=LOGS[isinstance(self.processes[0], RunnerThread)])

    @property
    def pid(self) -> int:
        return self.processes[0].pid

    @property
    def pids(self) -> list[int]:
        """Every process of the runner, rank 0 first."""
        return [proc.pid for proc in self.processes]

    @property
    def alive(self) -> bool:
        return self.failure is None

    @property
    def busy(self) -> int:
        return len(self._pending)

    def memory(self) -> int:
        """Resident bytes of the runner's processes (0 once they are gone; in-process: this whole process's)."""
        total = 0
        for proc in self.processes:
            try:
                with open(f"/proc/{proc.pid}/statm") as f:
                    total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError, IndexError):
                pass
        return total

    # -- requests --------------------------------------------------------------------------------

    async def load(self, spec: p.Load, timeout: float) -> int:
        """Load the model; the context length it got. BackendError when the runner refuses or dies."""
        future = asyncio.get_running_loop().create_future()
        self._pending[-1] = future
        await self._send(spec)
        try:
            ready = await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            self.kill(f"no answer to load in {timeout:.0f} s")
            raise RunnerStopped(self._stopped(self.failure)) from None
        finally:
            self._pending.pop(-1, None)
        if isinstance(ready, _Gone):
            raise RunnerStopped(self._stopped(ready.why))
        self.context_length = ready.context_length
        return ready.context_length

    async def stream(self, request: GenerationRequest, resolved: p.Resolved | None = None
                     ) -> AsyncIterator[StreamEvent]:
        """The runner's events for ``request``; ``resolved``: what the gateway resolved for it (``p.Resolved``)."""
        id_ = next(_ids)
        queue: asyncio.Queue = asyncio.Queue()
        if not self._working():
            self._last_event = time.monotonic()  # the quiet time counts from the first request in flight
        self._pending[id_] = queue
        seen = _Seen(request)
        finished = False
        refusal: BaseException | None = None  # the gateway refused to admit it: the client gets this error
        try:
            await self._send(p.Generate(id_, p.request_to_wire(request), admit=request.admit is not None,
                                        resolved=resolved))
            request.cancel.on_cancel(lambda: self._cancel(id_))
            while True:
                item = await queue.get()
                if isinstance(item, p.Admit):
                    refusal = await self._admit(id_, request, item)
                elif isinstance(item, p.Token):
                    seen.add(item.chunk)
                    yield item.chunk
                elif isinstance(item, p.Finished):
                    finished = True
                    yield item.done
                    return
                elif isinstance(item, p.Failed):
                    finished = True
                    raise refusal if refusal is not None else p.error_from_wire(item.error)
                else:
                    finished = True
                    raise RunnerStopped(self._stopped(item.why), partial=seen.partial())
        finally:
            self._pending.pop(id_, None)
            if not finished:
                self._cancel(id_)

    async def _admit(self, id_: int, request: GenerationRequest, asked: p.Admit) -> BaseException | None:
        """Answer a runner's ``Admit`` with ``request.admit``'s decision; the refusal, if it refused."""
        try:
            cap = await request.admit(asked.prompt_tokens, asked.context, asked.served_by)
        except Exception as exc:  # over budget, rate-limited, the database down: the runner stops it
            await self._send(p.Refused(id_))
            return exc
        await self._send(p.Admitted(id_, cap))
        return None

    async def embed(self, model: str, inputs: list, *, truncate: bool) -> EmbedResult:
        id_ = next(_ids)
        future = asyncio.get_running_loop().create_future()
        if not self._working():
            self._last_event = time.monotonic()
        self._pending[id_] = future
        try:
            await self._send(p.Embed(id_, model, inputs, truncate))
            item = await future
        finally:
            self._pending.pop(id_, None)
        if isinstance(item, p.Failed):
            raise p.error_from_wire(item.error)
        if isinstance(item, _Gone):
            raise RunnerStopped(self._stopped(item.why))
        return item.result

    def _cancel(self, id_: int) -> None:
        if self.alive and self._channel is not None and not self._channel.closed:
            self._channel.send(p.Cancel(id_))

    async def _send(self, message: Any) -> None:
        if self._channel is None:
            self._channel = await asyncio.shield(self._opening)
        if not self.alive:
            raise RunnerStopped(self._stopped(self.failure))
        self._channel.send(message)

    # -- events ----------------------------------------------------------------------------------

    def _opened(self, opening: asyncio.Task) -> None:
        """The channel, as soon as it is open (a runner stopped before its first message still closes it)."""
        if not opening.cancelled() and opening.exception() is None:
            self._channel = opening.result()

    def _received(self, message: Any) -> None:
        """A message from the runner, as the loop reads it (``Channel``: no task reads the socket). Its end
        (EOF) says nothing: the runner's pidfd says how it went (``_exited``)."""
        if isinstance(message, p.Pong):  # an answering event loop says nothing of a hung engine
            self.load_stats = message.load
            return
        self._last_event = time.monotonic()
        if isinstance(message, p.Outputs):  # one engine step: each request's Token, then its Finished
            self.load_stats = message.load or self.load_stats
            for each in (*message.tokens, *message.finished):
                self._deliver(each)
        else:
            self._deliver(message)

    def _deliver(self, message: Any) -> None:
        if isinstance(message, p.Finished):
            self.load_stats = message.load or self.load_stats
            self.spec_decode = message.spec_decode or self.spec_decode
        target = self._pending.get(-1 if isinstance(message, p.Ready) else message.id)
        if isinstance(target, asyncio.Queue):
            target.put_nowait(message)
        elif target is not None and not target.done():
            if isinstance(message, p.Failed) and message.id == -1:
                target.set_exception(p.error_from_wire(message.error))
            else:
                target.set_result(message)

    async def _watchdog(self) -> None:
        """Kill a runner that has work but went quiet; ask for its load now and then (it also reports
        it as each request starts and ends)."""
        while self.alive:
            await asyncio.sleep(min(self.ping_every, max(0.05, self.hang_timeout / 4)))
            working = self._working()
            quiet = time.monotonic() - self._last_event
            if working and quiet > self.hang_timeout:
                self.kill(f"hung: no event for {quiet:.1f} s while it had {self.busy} request(s)")
                return
            if not working:
                self._last_event = time.monotonic()
            await self._send(p.Ping(0))

    def _working(self) -> bool:
        return any(k != -1 for k in self._pending)

    # -- the end ---------------------------------------------------------------------------------

    def kill(self, why: str) -> None:
        """SIGKILL every process of the runner; its requests end with ``why``. An in-process runner cannot be
        killed: its socket is shut down under it and it is given up on (:class:`RunnerThread`)."""
        if self.failure is None:
            self.failure = why
        for proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)

    async def stop(self, grace: float = 5.0) -> None:
        """Ask the runner to exit, kill it after ``grace`` seconds; an expected end, not a fault."""
        self._stopping = True
        if self.alive:
            try:
                await self._send(p.Shutdown())
            except BackendError:
                pass
        deadline = time.monotonic() + grace
        while any(proc.poll() is None for proc in self.processes) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.kill("stopped")
        for proc in self.processes:
            await asyncio.get_running_loop().run_in_executor(None, proc.wait)
        self._close()

    def _exited(self, proc: subprocess.Popen | RunnerThread) -> None:
        code = proc.poll()
        why = self.failure or self._member(proc) + (getattr(proc, "why", None) or _exit_reason(code))
        self.failure = why
        for other in self.processes:  # one rank gone fails the group
            if other.poll() is None:
                other.send_signal(signal.SIGKILL)
        if not self._stopping:
            log.error("runner %d (%s) stopped: %s; %d request(s) in flight end with an error",
                      self.pid, self.engine, why, len([k for k in self._pending if k != -1]))
        for target in list(self._pending.values()):
            if isinstance(target, asyncio.Queue):
                target.put_nowait(_Gone(why))
            elif not target.done():
                target.set_result(_Gone(why))
        self._close()
        if self.on_exit is not None and not self._stopping:
            self.on_exit(self, why)

    def _member(self, proc: subprocess.Popen) -> str:
        """Which process of a group, for the reason it stopped ("" for a runner of one)."""
        if len(self.processes) == 1:
            return ""
        return f"tensor-parallel rank {self.processes.index(proc)} of {len(self.processes)}, pid {proc.pid}, "

    def _close(self) -> None:
        loop = asyncio.get_running_loop()
        for fd in self._exit_fds:
            if fd is not None:
                loop.remove_reader(fd)
                os.close(fd)
        self._exit_fds = []
        for task in self._tasks:
            task.cancel()
        if self._channel is not None:
            self._channel.close()


class _Seen:
    """What a request got before its runner died: the ``Done`` its error carries."""

    def __init__(self, request: GenerationRequest):
        self.request = request
        self.tokens = 0
        self.times: list[float] = []

    def add(self, chunk: Chunk) -> None:
        self.tokens += len(chunk.token_ids)
        self.times.append(time.perf_counter() - self.request.arrival)

    def partial(self) -> Done | None:
        if not self.times:
            return None
        timings = Timings(ttft=self.times[0], total=time.perf_counter() - self.request.arrival,
                          token_times=self.times)
        return Done("error", Usage(output_tokens=self.tokens), timings)


def _spawn(command: list[str], env: dict[str, str] | None, channel: socket.socket | None) -> subprocess.Popen:
    """One process of a runner; ``channel``: its end of the socket pair, inherited as ``{fd}``."""
    fds = (channel.fileno(),) if channel is not None else ()
    args = [arg.format(fd=fds[0]) if fds else arg for arg in command]
    return subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, pass_fds=fds)


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "exited"
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (the kernel's OOM killer sends it when memory runs out)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exit status {code}"


class RunnerThread:
    """A runner's body on a thread of this process, where ``Launch.single`` would start a process: what
    ``infer run --local`` runs, so that its model is served by the same scheduler, client and runner code
    as ``infer serve``'s. It answers the few questions ``RunnerClient`` asks of a ``subprocess.Popen``
    (``pid``: this process's; ``poll``: None while the body runs, then 0, or 1 if it raised).

    A thread cannot be killed. ``send_signal`` (the client's ``kill``: a hang, a load past its timeout,
    a stop past its grace) shuts the runner's socket down under it, so its next read or write ends it,
    and gives up on it at once: its requests end with the kill's reason and the scheduler forgets it,
    as after a process's SIGKILL. A body stuck inside an engine call keeps its thread (and its model's
    memory) until that call returns. A crash in native code (SIGSEGV, the OOM killer) takes the whole
    process down, as any in-process engine's would: the price of no process boundary. The body has no
    parent to watch (it ends with this process: a daemon thread) and no spare runner is started ahead."""

    def __init__(self, engine: str, fd: int):
        self.pid = os.getpid()
        self.returncode: int | None = None
        self.why: str | None = None  # set when the body raised
        self._control = socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM)  # a duplicate, to shut it down
        self._lock = threading.Lock()
        self._on_end: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, args=(engine, fd), name=f"runner-{engine}", daemon=True)
        self._thread.start()

    def _run(self, engine: str, fd: int) -> None:
        from .worker import serve_runner

        code = 0
        try:
            serve_runner(engine, fd, parent=None)
        except BaseException as exc:  # noqa: BLE001 - the body's end, reported as a process's exit would be
            log.exception("the in-process %s runner failed", engine)
            self.why, code = f"the in-process runner raised {type(exc).__name__}: {exc}", 1
        self._end(code)

    def watch(self, on_end: Callable[[], None]) -> None:
        """Call ``on_end`` once, when the body ends or is given up on (at once if it already was)."""
        with self._lock:
            self._on_end = on_end
            ended = self.returncode is not None
        if ended:
            on_end()

    def _end(self, code: int) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            self.returncode = code
            on_end = self._on_end
        if on_end is not None:
            on_end()

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        try:
            self._control.shutdown(socket.SHUT_RDWR)
        except OSError:  # the body already closed its end
            pass
        self._end(-sig)

    def wait(self) -> int | None:
        """The body's end; for a body given up on, at once (its thread may still be inside the engine)."""
        if self.returncode is None or self.returncode >= 0:
            self._thread.join()
        self._control.close()
        return self.returncode


def _watch_exit(loop: asyncio.AbstractEventLoop, proc: subprocess.Popen | RunnerThread, callback) -> int | None:
    """Call ``callback(proc)`` on the loop when ``proc`` exits: a pidfd (Linux 5.3+) or a waiting thread
    (an in-process runner tells it itself)."""
    if isinstance(proc, RunnerThread):
        def ended() -> None:
            try:
                loop.call_soon_threadsafe(callback, proc)
            except RuntimeError:  # the loop is closed: nobody is left to tell
                pass
        proc.watch(ended)
        return None
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        def wait() -> None:
            proc.wait()
            loop.call_soon_threadsafe(callback, proc)
        threading.Thread(target=wait, daemon=True, name=f"runner-{proc.pid}").start()
        return None

    def readable() -> None:
        loop.remove_reader(fd)
        proc.wait()
        callback(proc)
    loop.add_reader(fd, readable)
    return fd
