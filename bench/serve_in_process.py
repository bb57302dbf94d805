"""``infer serve`` with the local engines inside the gateway process, as before runners existed: for
bench/runner_overhead.py's same-tree side only (the cost of the process boundary with the engine code held
equal). Not a product mode: a crash in an engine here takes the whole server down, which is why runners exist.

    python bench/serve_in_process.py [infer serve's options]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gateway.app  # noqa: E402
from adapters.engines.local import in_process_engines  # noqa: E402


def _in_process(store, settings, *, log_level: str = "warning"):
    return in_process_engines(store, settings)


if __name__ == "__main__":
    gateway.app.runner_engines = _in_process
    from cli.main import app

    sys.argv = ["infer", "serve", *sys.argv[1:]]
    app()
