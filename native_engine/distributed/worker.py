"""``python -m native_engine.distributed.worker --rank R --world-size N --init-method URL``: rank R > 0.

A worker joins the group, then serves rank 0 (vLLM's worker loop): it waits for an engine config
(`Kind.LOAD`), loads its shard of that model (`model_loading`: the same steps as rank 0, in the same
order), then executes each step's plan as it arrives (`Kind.RUN`, `Kind.SCORE`) until the engine closes
(`Kind.UNLOAD`: back to waiting, so tests can share one group across engines) or the group ends
(`Kind.EXIT`). It never schedules or samples. Started by an engine (`TensorParallelGroup.spawn`) or by
the gateway, one command per rank; it exits with its parent (Linux ``PR_SET_PDEATHSIG``), and a rank
that dies makes rank 0's next collective fail ("Connection closed by peer").
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import logging
import os
import signal

import torch

from .. import platform
from ..model_loading import build_runner, read_checkpoint
from ..model_runner import ModelRunner
from .parallel_state import Kind, TensorParallelGroup, default_threads

log = logging.getLogger(__name__)


def serve(group: TensorParallelGroup) -> None:
    """Load the models rank 0 asks for and execute their steps, until `Kind.EXIT`."""
    while True:
        kind, payload = group.recv_plan()
        if kind == Kind.EXIT:
            return
        if kind != Kind.LOAD:
            raise RuntimeError(f"rank {group.rank}: expected a model to load, got {Kind(kind).name}")
        config = group.object_from(payload)
        torch.set_num_threads(config.num_threads or default_threads(group.world_size))
        runner = build_runner(config, read_checkpoint(config, group.device), group.device, group)
        done = execute(runner, group)
        del runner
        gc.collect()
        if done:
            return


def execute(runner: ModelRunner, group: TensorParallelGroup) -> bool:
    """Run the plans rank 0 sends until the model is unloaded (False) or the group ends (True).

    A worker never waits for its GPU: it reuses its input buffers when the next plan comes, which rank 0
    sends only after its own host sync on the sampled ids, and those needed this rank's logits gather, the
    last of its collectives, so its previous step's copies are done by then."""
    while True:
        kind, payload = group.recv_plan()
        if kind == Kind.RUN:
            runner.execute(*ModelRunner.step_from(payload))
        elif kind == Kind.SCORE:
            runner._score(payload.tolist())
        elif kind in (Kind.UNLOAD, Kind.EXIT):
            return kind == Kind.EXIT
        else:
            raise RuntimeError(f"rank {group.rank}: unexpected {Kind(kind).name} while a model is loaded")


def die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m native_engine.distributed.worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-method", required=True, help="file://PATH or tcp://HOST:PORT")
    parser.add_argument("--device", default="auto", help="rank 0's device; rank R takes the R-th GPU after it")
    parser.add_argument("--parent", type=int, help="the process that started this one; it exits with it")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    die_with_parent()
    if args.parent is not None and os.getppid() != args.parent:
        return  # the parent died while this process started
    logging.basicConfig(level=args.log_level.upper(), format=f"%(asctime)s tp-rank[{args.rank} {os.getpid()}] "
                        "%(levelname)s %(name)s: %(message)s")
    group = TensorParallelGroup.join(args.rank, args.world_size, args.init_method,
                                     platform.resolve_device(args.device))
    try:
        serve(group)
    except RuntimeError as exc:
        if group.failure is None:
            raise
        log.info("rank %d: the group ended (%s); exiting", args.rank, group.failure)
        raise SystemExit(0) from None


if __name__ == "__main__":
    main()
