"""Where `infer serve` spends its time per request: py-spy on the server under bench/gateway_overhead.py's c=1 load.

Starts the fast OpenAI-compatible server and ``infer serve --config`` in front of it (as
bench/gateway_overhead.py), sends requests one after another through the gateway (streaming and not,
alternated) for ``--seconds``, while ``py-spy record`` samples the server (``--rate`` Hz, idle
samples dropped, so shares are of the server's busy time). Prints the top frames by self share, the
top functions by inclusive share, and writes the collapsed stacks (``--out``, for a flame graph:
``py-spy``'s ``.folded`` format) and a JSON summary next to them.

    .venv/bin/python bench/profile_gateway.py [--seconds 20] [--rate 500] [--out .bench/profile/infer.folded]

Needs py-spy (``.venv/bin/pip install py-spy``) and permission to ptrace the server (root, or
``kernel.yama.ptrace_scope=0``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_overhead import ROOT, WORK, Processes, make_client, request, run_async, start_fast, start_infer  # noqa: E402


def py_spy() -> str:
    exe = Path(sys.executable).parent / "py-spy"
    found = str(exe) if exe.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


async def load(side, seconds: float, chunks: int, mode: str) -> int:
    deadline, n = time.perf_counter() + seconds, 0
    async with make_client(4) as client:
        while time.perf_counter() < deadline:
            stream = mode == "stream" or (mode == "both" and n % 2 == 1)
            await request(client, side, stream, chunks)
            n += 1
    return n


def frame_key(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py)``, the project's paths kept from the package on."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("/site-packages/", "/lib/python3."):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        path = path.replace(str(ROOT) + "/", "")
    return f"{name} ({path})"


PROJECT = ("gateway/", "adapters/", "ledger/", "cli/", "registry/")


def layer(key: str) -> str:
    """The package (or stdlib module) a frame belongs to: uvicorn, starlette, httpx, gateway, asyncio, ..."""
    path = key.rsplit(" (", 1)[1].rstrip(")")
    top = path.split("/", 1)[0]
    return top[:-3] if top.endswith(".py") else top


def shares(folded: Path) -> dict:
    """Shares of the server's busy samples: the main (event loop) thread's self time by frame and by
    layer, inclusive time of functions, and the other threads (the ledger writer) apart."""
    self_counts, layers, incl, threads, total = Counter(), Counter(), Counter(), Counter(), 0
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [frame_key(f) for f in stack.split(";")]
        total += n
        if frames[0].startswith("Thread._bootstrap (threading"):
            threads[next((f for f in reversed(frames) if f.split(" (")[1].startswith(PROJECT)), frames[-1])] += n
            continue
        self_counts[frames[-1]] += n
        layers[layer(frames[-1])] += n
        for key in set(frames):
            incl[key] += n
    return {"samples": total,
            "main_thread": sum(self_counts.values()) / total if total else 0.0,
            "self": [(k, v / total) for k, v in self_counts.most_common(60)],
            "layers": [(k, v / total) for k, v in layers.most_common(30)],
            "inclusive": [(k, v / total) for k, v in incl.most_common(300)],
            "other_threads": [(k, v / total) for k, v in threads.most_common(10)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--mode", choices=["both", "stream", "nonstream"], default="both")
    parser.add_argument("--variant", choices=["infer", "priced", "keyed"], default="infer",
                        help="as bench/gateway_overhead.py --cost: a priced backend, or priced + a key with a budget")
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "profile" / "infer.folded")
    args = parser.parse_args()
    spy = py_spy()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    work = WORK / "profile-run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    procs = Processes()
    try:
        fast = start_fast(procs, work, args.chunks)
        infer = start_infer(procs, work, fast, args.variant)[0]
        run_async(load(infer, 2.0, args.chunks, args.mode))  # warm-up
        recorder = subprocess.Popen([spy, "record", "--pid", str(infer.pid), "--rate", str(args.rate), "--format",
                                     "raw", "--output", str(args.out), "--duration", str(int(args.seconds) + 1)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)
        n = run_async(load(infer, args.seconds, args.chunks, args.mode))
        _, err = recorder.communicate(timeout=args.seconds + 60)
        if recorder.returncode != 0:
            raise SystemExit(f"py-spy failed: {err.decode(errors='replace')[-500:]}")
    finally:
        procs.stop_all()
    result = {"requests": n, "seconds": args.seconds, **shares(args.out)}
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    busy_ms = result["samples"] / args.rate / n * 1e3
    print(f"{n} {args.mode} requests through infer serve in {args.seconds:g} s at c=1 ({result['samples']} busy "
          f"samples at {args.rate} Hz, ~{busy_ms:.2f} ms busy per request; event-loop thread "
          f"{result['main_thread']:.0%}, other threads {1 - result['main_thread']:.0%})")
    print("\nevent-loop thread, self time by layer (share of all busy samples):")
    for key, share in result["layers"][:15]:
        print(f"  {share:6.1%}  {key}")
    print(f"\ntop {args.top} frames by self share:")
    for key, share in result["self"][:args.top]:
        print(f"  {share:6.1%}  {key}")
    print(f"\ntop {args.top} project functions by inclusive share:")
    project = [(k, v) for k, v in result["inclusive"] if k.rsplit(" (", 1)[1].startswith(PROJECT)]
    for key, share in project[:args.top]:
        print(f"  {share:6.1%}  {key}")
    print("\nother threads (innermost project frame):")
    for key, share in result["other_threads"]:
        print(f"  {share:6.1%}  {key}")
    print(f"\nwrote {args.out} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
