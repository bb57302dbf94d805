"""``python -m adapters.engines.runner --engine E --fd N --parent PID``: one runner process.

Started by the gateway's scheduler (``adapters/engines/runner/client.py``), never by hand; see ``worker.py``
(llama.cpp, scripted) and ``engine_core.py`` (native). ``infer run --local`` runs the same body
(``worker.serve_runner``) on a thread instead (``client.RunnerThread``).
"""

from __future__ import annotations

import argparse
import logging
import os

from .worker import die_with_parent, serve_runner


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m adapters.engines.runner")
    parser.add_argument("--engine", required=True)
    parser.add_argument("--fd", type=int, required=True, help="the channel to the gateway (an inherited socket)")
    parser.add_argument("--parent", type=int, required=True, help="the gateway's pid; the runner exits with it")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    die_with_parent()
    if os.getppid() != args.parent:
        return  # the gateway died while this process started
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s runner[{os.getpid()} {args.engine}] %(levelname)s %(name)s: %(message)s")
    serve_runner(args.engine, args.fd, args.parent)


if __name__ == "__main__":
    main()
