"""``infer run --local`` on SmolLM2-135M (Q4_1): first-token latency and decode tok/s of a turn, for this
tree and, with ``--baseline DIR``, another source tree, both sides in one run.

    git archive <commit> | tar -x -C /tmp/base
    flock /tmp/infer-heavy.lock .venv/bin/python bench/run_local.py --baseline /tmp/base

Per round, for each engine (native, llama.cpp), each side in turn (the order flips every round, so a
noisy moment on a shared machine hits both):

- *cold*: ``python -m cli run smollm2:135m PROMPT --local --engine E`` as a user starts it: seconds from
  spawning it to the first byte of the answer on stdout (Python start, imports, load, prompt, first token);
- *warm*: a fresh Python in that tree builds ``cli.chat_session.ChatSession`` as ``infer run --local``
  does, answers one turn (the load), then ``--turns`` more: TTFT = ``send`` called -> first text written;
  decode tok/s = (output tokens - 1) / (last text written - first text written). Each turn is the same
  ~40-token prompt, a fresh history, greedy, ``--tokens`` tokens (``ignore_eos``).

Medians over every turn (warm) and every spawn (cold) of a side; ratio = this tree / baseline.
The store is a temporary one (``INFER_HOME``, ``INFER_MODELS``), so the ledger rows go there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2:135m"
ENGINES = ("native", "llamacpp")
PROMPT = "Write a long story about a lighthouse keeper who finds a map in a bottle, and tell it slowly."


def make_store(home: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from registry.create import create_model
    from registry.modelfile import parse_modelfile
    from registry.names import parse_name
    from registry.realmodels import fetch_smollm2
    from registry.store import Store

    create_model(Store(home / "models"), parse_name(MODEL), parse_modelfile(f"FROM {fetch_smollm2()}\n"), home)
    return home / "models"


def env_for(tree: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFER_", "OLLAMA_"))}
    env.update(INFER_HOME=str(home), INFER_MODELS=str(home / "models"), INFER_KEEP_ALIVE="-1",
               INFER_HOST="127.0.0.1:1", PYTHONPATH=str(tree))
    return env


def cold(tree: Path, home: Path, engine: str) -> float:
    """Seconds from spawning ``infer run --local`` to the first byte of its answer."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "run", MODEL, PROMPT, "--local", "--engine", engine],
                            cwd=tree, env=env_for(tree, home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    first = proc.stdout.read(1)
    seconds = time.perf_counter() - t0
    rest, err = proc.communicate(timeout=300)
    if proc.returncode != 0 or not first:
        raise SystemExit(f"{tree}: infer run --local --engine {engine} failed: {err.decode()[-2000:]}")
    return seconds


def warm(tree: Path, home: Path, engine: str, turns: int, tokens: int) -> list[dict]:
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", engine, "--turns", str(turns),
                          "--tokens", str(tokens)], cwd=tree, env=env_for(tree, home), capture_output=True,
                         text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{tree}: the warm side failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the child: one tree's ChatSession, in its own Python -------------------------------------------

class Clock:
    """``ChatSession``'s stdout: the time of each write of answer text."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def write(self, text: str) -> None:
        if text.strip():
            self.times.append(time.perf_counter())

    def flush(self) -> None:
        pass


def child(engine: str, turns: int, tokens: int) -> None:
    import asyncio

    sys.path.insert(0, os.getcwd())  # the tree under test, ahead of the installed one
    from cli.chat_session import ChatSession, local_settings_from_env
    from core.settings import default_database_url
    from registry.store import Store

    async def go() -> list[dict]:
        clock = Clock()
        session = ChatSession(Store(os.environ["INFER_MODELS"]), MODEL, settings=local_settings_from_env(engine),
                              db_url=default_database_url(Path(os.environ["INFER_HOME"])), out=clock)
        session.options = {"temperature": 0, "num_predict": tokens, "ignore_eos": True}
        results = []
        try:
            for turn in range(turns + 1):
                session.messages.clear()
                clock.times.clear()
                t0 = time.perf_counter()
                done = await session.send(PROMPT)
                if turn == 0:
                    continue  # the load
                first, last = clock.times[0], clock.times[-1]
                n = done.usage.output_tokens
                results.append({"ttft": first - t0, "tok_s": (n - 1) / (last - first), "tokens": n})
        finally:
            await session.aclose()
        return results

    print(json.dumps(asyncio.run(go())))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", type=Path, help="another source tree (e.g. git archive of main)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--no-cold", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.turns, args.tokens)
        return
    sides = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    engines = args.engines.split(",")
    with tempfile.TemporaryDirectory(prefix="infer-run-local-") as tmp:
        home = Path(tmp)
        make_store(home)
        seen = {(side, e): {"cold": [], "ttft": [], "tok_s": []} for side in sides for e in engines}
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for engine in engines:
                for side in order:
                    got = seen[(side, engine)]
                    if not args.no_cold:
                        got["cold"].append(cold(sides[side], home, engine))
                    for turn in warm(sides[side], home, engine, args.turns, args.tokens):
                        got["ttft"].append(turn["ttft"])
                        got["tok_s"].append(turn["tok_s"])
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    report(seen, sides, engines)


def report(seen: dict, sides: dict, engines: list[str]) -> None:
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    print(f"{'engine':<9} {'side':<9} {'cold first byte s':>18} {'warm TTFT ms':>13} {'decode tok/s':>13}")
    for engine in engines:
        for side in sides:
            got = seen[(side, engine)]
            print(f"{engine:<9} {side:<9} {med(got['cold']):>18.2f} {1000 * med(got['ttft']):>13.1f} "
                  f"{med(got['tok_s']):>13.1f}")
        if len(sides) == 2:
            this, base = seen[("this", engine)], seen[("baseline", engine)]
            print(f"{engine:<9} {'ratio':<9} {med(this['cold']) / med(base['cold']) if this['cold'] else float('nan'):>18.3f} "
                  f"{med(this['ttft']) / med(base['ttft']):>13.3f} {med(this['tok_s']) / med(base['tok_s']):>13.3f}")


if __name__ == "__main__":
    main()
