"""The path of one streamed ``/api/chat`` to a native model (issue 41): the project files it runs and its
hand-offs, traced in the gateway and in the runner, for this tree and optionally an older one.

    flock /tmp/infer-heavy.lock .venv/bin/python bench/request_path.py --baseline /tmp/base [--keyed]

Each tree's ``infer serve`` runs over a store with SmolLM2-135M (``INFER_ENGINE=native``) with a
``sitecustomize`` on ``PYTHONPATH`` that puts a profile hook (``sys.setprofile``, every thread) in the
gateway and in its runners; it records nothing until SIGUSR1 and writes what it saw at SIGUSR2. A
warm-up chat loads the model; then the gateway and the model's runner (its pid from ``/api/ps``) get
SIGUSR1, one streamed chat runs (8 tokens; with ``--keyed`` a ledger key's, admitted before it
generates), and SIGUSR2 ends the window. Reported per tree:

- **files**: the project's files whose functions ran in the window, per process; "to the engine" leaves
  out ``native_engine/`` below ``LLMEngine.step`` (its model, kernels and sampler: the engine's insides,
  which the issue's "from the HTTP route to LLMEngine.step and back" does not count), and the ledger
  and pricing modules that run after the answer;
- **hand-offs**: each place where the request's data changes task, thread or process, recognised by
  the function that makes the hand-off (``HAND_OFFS``) having run in the window.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from runner_overhead import MODEL, create_key, free_port, make_store, server_env  # noqa: E402

# (path suffix, qualified name) of the function that makes the hand-off -> what crosses
HAND_OFFS = {
    ("adapters/engines/runner/client.py", "RunnerClient._send"): "gateway -> runner: a socket write",
    ("adapters/engines/runner/worker.py", "Worker._spawn"): "runner: a new task per message",
    ("native_engine/async_engine.py", "AsyncLLMEngine._submit"): "runner loop -> engine thread: deque + Event",
    ("native_engine/async_engine.py", "_Stream.put"): "engine thread -> runner loop: call_soon_threadsafe",
    ("adapters/engines/runner/worker.py", "Worker.send"): "runner -> gateway: a socket write",
    ("adapters/engines/runner/channel.py", "BlockingChannel.send"): "runner -> gateway: a socket write (one per step)",
    ("adapters/engines/runner/client.py", "RunnerClient._receive"): "gateway: the receive task -> the request's queue",
    ("adapters/engines/runner/client.py", "RunnerClient._admit"): "gateway -> runner: Admitted (the Admit round trip)",
    ("adapters/engines/runner/worker.py", "Worker._answer"): "runner: the Admitted answer -> the waiting task",
    ("gateway/serving/recorder.py", "_Channel.put"): "gateway: the recorder's pump task -> the response",
    ("gateway/serving/recorder.py", "_Handover.put"): "gateway: the recorder's pump task -> the response",  # renamed
    ("ledger/writer.py", "LedgerWriter.submit"): "gateway loop -> the ledger thread",
}
AFTER_THE_ANSWER = ("ledger/", "pricing/")
ENGINE_FILES = ("native_engine/llm_engine.py", "native_engine/async_engine.py")

SITECUSTOMIZE = '''
import os, signal, sys, threading, json
_root, _out = os.environ.get("TRACE_ROOT"), os.environ.get("TRACE_OUT")
if _root and _out:
    _seen, _on = set(), [False]

    def _profile(frame, event, arg):
        if event == "call" and _on[0]:
            code = frame.f_code
            if code.co_filename.startswith(_root) and "/.venv/" not in code.co_filename:
                _seen.add((code.co_filename[len(_root) + 1:], code.co_qualname))

    def _start(*_):
        _seen.clear()
        _on[0] = True

    def _stop(*_):
        _on[0] = False
        with open(f"{_out}.{os.getpid()}.json", "w") as f:
            json.dump(sorted(_seen), f)

    sys.setprofile(_profile)
    threading.setprofile(_profile)
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
'''


def chat(url: str, key: str | None, tokens: int) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about lighthouses."}], "stream": True,
            "options": {"engine": "native", "num_predict": tokens, "temperature": 0, "ignore_eos": True}}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.stream("POST", url + "/api/chat", json=body, headers=headers, timeout=300) as resp:
        lines = [json.loads(line) for line in resp.iter_lines() if line]
    if not lines or "error" in lines[-1] or not lines[-1].get("done"):
        raise RuntimeError(f"the chat failed: {lines[-1:]}")


def trace_tree(tree: Path, name: str, models: Path, work: Path, keyed: bool) -> dict[str, list]:
    hook = work / f"{name}-hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    key = create_key(tree, name, models, work) if keyed else None
    port = free_port()
    out = work / f"{name}-trace"
    env = server_env(tree, name, models, work)
    env.update(INFER_HOST=f"127.0.0.1:{port}", INFER_ENGINE="native", PYTHONPATH=f"{tree}{os.pathsep}{hook}",
               TRACE_ROOT=str(tree), TRACE_OUT=str(out))
    log = open(work / f"{name}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--log-level", "warning"], cwd=tree, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url, proc)
        chat(url, key, 4)  # loads the model
        runner = next(m["runner"]["pid"] for m in httpx.get(url + "/api/ps").json()["models"])
        pids = {"gateway": proc.pid, "runner": runner}
        for pid in pids.values():
            os.kill(pid, signal.SIGUSR1)
        time.sleep(0.5)
        chat(url, key, 8)
        time.sleep(1.0)  # the ledger row is written
        for pid in pids.values():
            os.kill(pid, signal.SIGUSR2)
        time.sleep(1.0)
        return {side: [tuple(item) for item in json.loads(Path(f"{out}.{pid}.json").read_text())]
                for side, pid in pids.items()}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _wait(url: str, proc: subprocess.Popen) -> None:
    for _ in range(600):
        try:
            if httpx.get(url + "/", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            if proc.poll() is not None:
                raise RuntimeError("infer serve exited") from None
            time.sleep(0.1)
    raise RuntimeError("infer serve did not start")


def summary(seen: dict[str, list]) -> dict:
    files = {side: sorted({path for path, _ in calls}) for side, calls in seen.items()}
    to_engine = {side: [f for f in found if (not f.startswith("native_engine/") or f in ENGINE_FILES)
                        and not f.startswith(AFTER_THE_ANSWER)] for side, found in files.items()}
    calls = {(path, name) for found in seen.values() for path, name in found}
    hand_offs = [what for (path, name), what in HAND_OFFS.items() if (path, name) in calls]
    return {"files": files, "to_engine": to_engine, "hand_offs": hand_offs}


def report(name: str, got: dict) -> None:
    total = sum(len(v) for v in got["to_engine"].values())
    every = sum(len(v) for v in got["files"].values())
    print(f"\n== {name}: {total} files from the route to LLMEngine.step and back ({every} with the engine's insides "
          f"and the ledger); {len(got['hand_offs'])} hand-offs")
    for side, found in got["to_engine"].items():
        print(f"  {side} ({len(found)}): {' '.join(found)}")
    for what in got["hand_offs"]:
        print(f"  hand-off: {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="an older source tree to trace the same way")
    parser.add_argument("--keyed", action="store_true", help="the chat carries a ledger key")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    trees = {"this tree": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    results = {}
    with tempfile.TemporaryDirectory(prefix="request-path-") as tmp:
        work = Path(tmp)
        models = make_store(work / "store")
        for i, (name, tree) in enumerate(trees.items()):
            results[name] = summary(trace_tree(tree, f"side{i}", models, work, args.keyed))
    for name, got in results.items():
        report(name, got)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
