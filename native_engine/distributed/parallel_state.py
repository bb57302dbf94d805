"""One tensor-parallel group on `torch.distributed`: gloo on CPU, NCCL on CUDA, nothing hand-made.

A group is two process groups over the same ranks, made without `init_process_group` (vLLM's
`stateless_init_torch_distributed_process_group`: no default group, no global state, so two engines in
one process, or a test that makes groups of several sizes in turn, never see each other's):

- `device_group` carries the activations: the all-reduce after each row-parallel linear and the
  embedding, the logits gather to rank 0. gloo over the CPU tensors, NCCL over the CUDA ones (captured by
  the decode step's CUDA graphs: `ProcessGroupNCCL` leaves captured work out of its watchdog).
- `cpu_group` (gloo, CPU tensors) carries control: rank 0's engine config at start, each step's plan
  (`send_plan` / `recv_plan`: a fixed header, then the plan itself), the agreed KV-cache size. On CPU it is
  the device group itself.

The ranks meet through a `torch.distributed` store: `file://PATH` (a `FileStore`; every rank on this
machine, no port to pick or collide on) or `tcp://HOST:PORT` (a `TCPStore` served by rank 0).
`spawn` starts ranks 1..N-1 as `python -m native_engine.distributed.worker` processes for an engine made
in this process; the gateway starts them itself, one command per rank (`adapters/engines/runner/client.py`).

On CPU the group times its collectives (`stats`: count, seconds, bytes) for `bench/tp.py`; on CUDA the
calls only enqueue work, so there is nothing to time on the host.
"""

from __future__ import annotations

import datetime
import enum
import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
PLAN_HEADER = 3  # kind, payload length, spare
# A worker waits for the next step as long as the engine is idle; a dead peer still ends the wait at
# once (gloo: "Connection closed by peer"), and the gateway watches each rank's process.
IDLE_TIMEOUT = datetime.timedelta(days=7)
JOIN_TIMEOUT = datetime.timedelta(minutes=5)


class Kind(enum.IntEnum):
    """What rank 0 sends the other ranks (`send_plan`)."""

    RUN = 1  # a step: block copies and the `StepPlan`
    SCORE = 2  # logits of one prompt, without the cache (`LLMEngine.score`)
    LOAD = 3  # an engine config: load its model, size the KV cache, capture graphs, then wait for steps
    UNLOAD = 4  # the engine closed: drop the model, wait for the next LOAD
    EXIT = 5


def default_threads(world_size: int) -> int:
    """Each rank's torch threads when the config sets none: the CPU's cores shared by the ranks."""
    return max(1, (os.cpu_count() or 1) // world_size)


def backend_for(device: torch.device) -> str:
    if device.type not in BACKENDS:
        raise ValueError(f"tensor parallelism runs on cpu or cuda, not {device}")
    return BACKENDS[device.type]


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r's device: the same CPU, or the r-th GPU counted from the configured one."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)


def new_init_method() -> str:
    """A fresh rendezvous file for one group (removed by rank 0 once every rank has joined)."""
    return f"file://{tempfile.mkdtemp(prefix='infer-tp-')}/store"


@dataclass
class CollectiveStats:
    count: int = 0
    seconds: float = 0.0
    bytes: int = 0

    def reset(self) -> None:
        self.count, self.seconds, self.bytes = 0, 0.0, 0


@dataclass(eq=False)
class TensorParallelGroup:
    rank: int
    world_size: int
    device: torch.device
    device_group: dist.ProcessGroup
    cpu_group: dist.ProcessGroup
    init_method: str = ""
    workers: list[subprocess.Popen] = field(default_factory=list)  # the ranks this process started
    stats: CollectiveStats = field(default_factory=CollectiveStats)
    failure: str | None = None  # why a collective failed: the group is broken for good
    closed: bool = False

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    # -- making one ------------------------------------------------------------------------------

    @classmethod
    def join(cls, rank: int, world_size: int, init_method: str, device: torch.device,
             timeout: datetime.timedelta = IDLE_TIMEOUT) -> TensorParallelGroup:
        """Rank ``rank``'s membership; blocks until every rank has joined."""
        device = rank_device(device, rank)
        store = _store(init_method, rank, world_size)
        cpu = _gloo(dist.PrefixStore("cpu", store), rank, world_size, timeout)
        if device.type == "cuda":
            torch.cuda.set_device(device)
            device_group = _nccl(dist.PrefixStore("nccl", store), rank, world_size)
        else:
            device_group = cpu
        group = cls(rank, world_size, device, device_group, cpu, init_method)
        group.barrier()  # every rank is in: the rendezvous file has done its work
        if rank == 0:
            _remove_rendezvous(init_method)
        return group

    @classmethod
    def spawn(cls, world_size: int, device: torch.device, *, log_level: str = "WARNING") -> TensorParallelGroup:
        """Rank 0 here, ranks 1..N-1 as worker processes (they exit with this process)."""
        init_method = new_init_method()
        workers = [subprocess.Popen(worker_command(rank, world_size, init_method, device, log_level),
                                    stdin=subprocess.DEVNULL, env=_worker_env()) for rank in range(1, world_size)]
        try:
            group = cls.join(0, world_size, init_method, device)
        except BaseException:
            for proc in workers:
                proc.kill()
            raise
        group.workers = workers
        return group

    # -- the activations -------------------------------------------------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place."""
        return self._timed(x, lambda: self._wait(lambda: self.device_group.allreduce([x])))

    def _wait(self, collective) -> None:
        """Start a collective and wait for its end; a rank that died or hung breaks the group for good."""
        self.check()
        try:
            collective().wait()
        except RuntimeError as exc:
            self.failure = self.failure or str(exc).splitlines()[0]
            raise RuntimeError(f"a tensor-parallel rank failed ({self.failure}); the group must be restarted") \
                from exc

    def _check_workers(self) -> None:
        for rank, proc in enumerate(self.workers, start=1):
            code = proc.poll()
            if code is not None and self.failure is None:
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
                self.failure = f"rank {rank} (pid {proc.pid}) exited: {how}"
        self.check()

    def check(self) -> None:
        if self.failure is not None:
            raise RuntimeError(f"a tensor-parallel rank failed ({self.failure}); the group must be restarted")

    def gather_rows(self, local: torch.Tensor, widths: list[int]) -> torch.Tensor | None:
        """[S, widths[rank]] from every rank -> [S, sum(widths)] on rank 0 (None elsewhere). Each rank sends
        its part padded to the widest (a gather moves equal sizes)."""
        widest = max(widths)
        if local.shape[1] < widest:
            local = torch.nn.functional.pad(local, (0, widest - local.shape[1]))
        local = local.contiguous()
        options = dist.GatherOptions()
        options.rootRank = 0
        parts = [torch.empty_like(local) for _ in range(self.world_size)] if self.rank == 0 else []
        gather = lambda: self.device_group.gather([parts] if parts else [], [local], options)  # noqa: E731
        self._timed(local, lambda: self._wait(gather))
        if self.rank != 0:
            return None
        return torch.cat([p[:, :w] for p, w in zip(parts, widths, strict=True)], dim=1)

    def _timed(self, x: torch.Tensor, collective) -> torch.Tensor:
        if self.device.type != "cpu":
            collective()
            return x
        start = time.perf_counter()
        collective()
        self.stats.count += 1
        self.stats.seconds += time.perf_counter() - start
        self.stats.bytes += x.numel() * x.element_size()
        return x

    # -- control (CPU tensors) -------------------------------------------------------------------

    def barrier(self) -> None:
        self.min_int(0)

    def min_int(self, value: int) -> int:
        """The smallest of every rank's ``value`` (the KV blocks every rank can hold)."""
        t = torch.tensor([value], dtype=torch.int64)
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MIN
        self._wait(lambda: self.cpu_group.allreduce([t], options))
        return int(t.item())

    def _broadcast(self, t: torch.Tensor) -> torch.Tensor:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self._wait(lambda: self.cpu_group.broadcast([t], options))
        return t

    def send_plan(self, kind: int, payload: np.ndarray | None = None) -> None:
        """Rank 0: one message to every other rank: ``kind`` and an int64 payload. Ranks this process started
        are looked at first: gloo does not always fail a broadcast to a peer that has died (the send can wait
        for the group's 30-minute timeout), so a dead worker fails the step here instead."""
        self._check_workers()
        n = 0 if payload is None else len(payload)
        self._broadcast(torch.tensor([kind, n, 0], dtype=torch.int64))
        if n:
            self._broadcast(torch.from_numpy(np.ascontiguousarray(payload, dtype=np.int64)))

    def recv_plan(self) -> tuple[int, np.ndarray]:
        """Ranks > 0: the next ``send_plan``."""
        header = self._broadcast(torch.empty(PLAN_HEADER, dtype=torch.int64))
        kind, n = int(header[0]), int(header[1])
        if not n:
            return kind, np.empty(0, np.int64)
        return kind, self._broadcast(torch.empty(n, dtype=torch.int64)).numpy()

    def send_object(self, kind: int, obj: object) -> None:
        self.send_plan(kind, object_payload(obj))

    @staticmethod
    def object_from(payload: np.ndarray) -> object:
        size = int(payload[0])
        return pickle.loads(payload[1:].view(np.uint8)[:size].tobytes())  # noqa: S301 - rank 0 of our own group

    # -- the end ---------------------------------------------------------------------------------

    def close(self, grace: float = 10.0) -> None:
        """Wait for the workers this process started (after they were told to exit), then let go."""
        if self.closed:
            return
        self.closed = True
        deadline = time.monotonic() + grace
        for proc in self.workers:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("tensor-parallel rank (pid %d) did not exit; killing it", proc.pid)
                proc.kill()
                proc.wait()

    def dead_workers(self) -> list[tuple[int, int]]:
        """(pid, exit status) of the started workers that have exited."""
        return [(p.pid, p.returncode) for p in self.workers if p.poll() is not None]


def object_payload(obj: object) -> np.ndarray:
    """``obj`` pickled into an int64 payload: its byte length, then the bytes zero-padded to 8."""
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    padded = np.zeros(-(-len(data) // 8) * 8, np.uint8)
    padded[: len(data)] = data
    return np.concatenate([np.array([len(data)], np.int64), padded.view(np.int64)])


def worker_command(rank: int, world_size: int, init_method: str, device: torch.device,
                   log_level: str = "WARNING", parent: int | None = None) -> list[str]:
    """How to start rank ``rank`` (> 0): it joins the group and executes what rank 0 sends. ``-P``: the
    working directory is not on its import path (only the project and its packages are imported)."""
    return [sys.executable, "-P", "-m", "native_engine.distributed.worker", "--rank", str(rank), "--world-size",
            str(world_size), "--init-method", init_method, "--device", str(device), "--log-level", log_level,
            "--parent", str(os.getpid() if parent is None else parent)]


def _worker_env() -> dict[str, str]:
    """This environment with the project's root first on ``PYTHONPATH``: a ``-P`` worker imports this
    tree's ``native_engine``, never the working directory's modules."""
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(os.path.isabs, os.environ.get(
        "PYTHONPATH", "").split(os.pathsep))])}


def _store(init_method: str, rank: int, world_size: int) -> dist.Store:
    url = urlparse(init_method)
    if url.scheme == "file":
        return dist.FileStore(url.path, world_size)
    if url.scheme == "tcp":
        return dist.TCPStore(url.hostname, url.port, world_size, is_master=rank == 0, timeout=JOIN_TIMEOUT)
    raise ValueError(f"distributed_init_method must be file://PATH or tcp://HOST:PORT, got {init_method!r}")


def _gloo(store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta) -> dist.ProcessGroup:
    """gloo over loopback: every rank of a group runs on this machine."""
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(store, rank, world_size, options)


def _nccl(store: dist.Store, rank: int, world_size: int) -> dist.ProcessGroup:
    """NCCL for the activations; its default timeout (a hung collective aborts the process, which the
    gateway sees as a dead rank). The plan waits on gloo, so an idle engine never times it out."""
    return dist.ProcessGroupNCCL(store, rank, world_size, dist.ProcessGroupNCCL.Options())


def _remove_rendezvous(init_method: str) -> None:
    url = urlparse(init_method)
    if url.scheme != "file":
        return
    for path in (url.path, os.path.dirname(url.path)):
        try:
            os.rmdir(path) if os.path.isdir(path) else os.unlink(path)
        except OSError:
            pass


def start_engine_group(config, device: torch.device, group: TensorParallelGroup | None = None
                       ) -> tuple[TensorParallelGroup | None, bool]:
    """Rank 0's group for an engine with ``config`` (None alone), every other rank told to load it; and
    whether the engine owns the group (it ends it on close). A group passed in (tests share one across
    engines) only unloads its model on close."""
    world_size = config.tensor_parallel_size
    if group is not None and (group.world_size != world_size or group.rank != 0):
        raise ValueError(f"a group of {group.world_size} ranks (this one rank {group.rank}) cannot run an engine "
                         f"with tensor_parallel_size {world_size}")
    if world_size == 1:
        return None, False
    owned = False
    if group is None and config.distributed_init_method:
        group = _started_elsewhere(config.distributed_init_method, world_size, device)
    elif group is None:
        group = TensorParallelGroup.spawn(world_size, device, log_level=logging.getLevelName(log.getEffectiveLevel()))
        owned = True
    group.send_object(Kind.LOAD, config)
    return group, owned


# The groups this process joined as rank 0 whose other ranks someone else started (a runner's, by the
# gateway): their lifetime is the process's, so a later engine in the same runner meets the same ranks.
_JOINED: dict[str, TensorParallelGroup] = {}


def _started_elsewhere(init_method: str, world_size: int, device: torch.device) -> TensorParallelGroup:
    group = _JOINED.get(init_method)
    if group is None or group.failure is not None:
        group = _JOINED[init_method] = TensorParallelGroup.join(0, world_size, init_method, device)
    return group


def stop_engine_group(group: TensorParallelGroup, owned: bool) -> None:
    """The engine closed: its ranks unload the model, and exit when the engine started them (ranks started
    elsewhere stay for the next engine, and end with their starter or when rank 0's process does)."""
    try:
        group.send_plan(Kind.EXIT if owned else Kind.UNLOAD)
    except RuntimeError as exc:  # a rank already gone: nothing left to tell
        log.warning("tensor-parallel group: %s", exc)
    if owned:
        group.close()
