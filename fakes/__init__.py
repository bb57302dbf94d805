"""Protocol-faithful fake inference servers: the remote adapters' tests and the benches share them.

    with start_server("tgi") as server:            # also "vllm", "trtllm", "triton"
        server.behaviour.token_delay = 0.01
        httpx.post(server.url + "/generate", json={...})

Each speaks its backend's documented wire format (serving-protocols.md §1 vLLM, §2 TGI, §3.1
trtllm-serve, §3.2 Triton's generate extension) over a shared deterministic
:class:`~.engine.FakeEngine`, and obeys a mutable :class:`~.behaviour.Behaviour`.
"""

from __future__ import annotations

import importlib

from .behaviour import Behaviour
from .engine import WORDS, FakeEngine, Generation
from .runner import RunningServer

KINDS = ("vllm", "tgi", "trtllm", "triton")

__all__ = ["KINDS", "WORDS", "Behaviour", "FakeEngine", "Generation", "RunningServer", "start_server"]


def start_server(kind: str, behaviour: Behaviour | None = None) -> RunningServer:
    """Start a fake ``kind`` server; use it as a context manager or call ``stop()``.

    ``behaviour.models`` defaults to the module's ``DEFAULT_MODEL`` (``"ensemble"`` for Triton).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (choose one of {', '.join(KINDS)})")
    module = importlib.import_module(f".{kind}", __name__)
    behaviour = behaviour or Behaviour()
    if not behaviour.models:
        behaviour.models = [module.DEFAULT_MODEL]
    return RunningServer(kind, module.make_app(behaviour), behaviour).start()
