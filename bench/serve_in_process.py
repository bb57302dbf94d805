"""``infer serve`` with each runner on a thread of the gateway process (``in_process_engines``, what
``infer run --local`` uses) instead of a process of its own: for bench/runner_overhead.py's same-tree side
only (the cost of a process, with the scheduler, the socket, the messages and the engine code held equal;
before issue 41 the engines ran here with no runner at all). Not a product mode: a crash in an engine here
takes the whole server down, which is why runners are processes.

    python bench/serve_in_process.py [infer serve's options]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gateway.app  # noqa: E402
from adapters.engines.runner.backend import in_process_engines  # noqa: E402


def _in_process(store, settings, *, log_level: str = "warning"):
    return in_process_engines(store, settings)


if __name__ == "__main__":
    gateway.app.runner_engines = _in_process
    from cli.main import app

    sys.argv = ["infer", "serve", *sys.argv[1:]]
    app()
