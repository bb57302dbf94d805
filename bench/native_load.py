"""How long a user waits for SmolLM2 (Q4_1 GGUF) to be ready on the native engine, llama.cpp beside it.

"Ready" means what Ollama's ``load_duration`` means: the model's weights, tokenizer and chat template
are loaded and the next step is evaluating the prompt. Every figure is from a fresh process, as a
user starts one; the sides alternate within each run (native, llama.cpp, native, ...), so a busy
neighbour slows both; the table shows medians over ``--runs``.

1. ``infer run smollm2:135m hi --engine E --local --verbose`` (a subprocess): seconds from spawning
   it to the first byte of the answer on stdout (Python start, imports, load, prompt, first token),
   and the ``load duration`` it prints.
2. ``infer serve`` with ``INFER_ENGINE=E``: seconds from spawning it until it answers HTTP, the
   ``load_duration`` of the first ``/api/generate`` (the model loads on that request, as in Ollama),
   and seconds from spawning the server to that first answer; then, from a second server, the first
   request's ``load_duration`` when it comes ``IDLE_S`` seconds after the server is up (a server
   started before it is used).
3. The engine alone, in a fresh Python: importing it (torch / llama_cpp) and constructing it with
   ``infer serve``'s settings (``LLMEngine`` with core.settings' native config, 2048-token
   context; ``llama_cpp.Llama(n_ctx=2048)``).

Goal (issue 16): native ready in <= 2 s. Run it alone: ``flock /tmp/infer-heavy.lock python bench/native_load.py``.

``--baseline DIR`` (issue 27) measures only ``infer serve``'s spawn -> first answer, for this tree (each
model in a runner process) and for the source tree ``DIR`` (e.g. ``git archive <before> | tar -x -C DIR``:
engines in the server's process), alternating within each run; goal: runners <= 1.10x that figure.
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fakes.live import free_port  # noqa: E402

MODEL = "smollm2:135m"
ENGINES = ("native", "llamacpp")
GOAL_S = 2.0
IDLE_S = 3.0

ENGINE_ALONE = {
    "native": """
import time; t0 = time.perf_counter()
from core.settings import DEFAULTS
from native_engine import EngineConfig, LLMEngine
t1 = time.perf_counter()
LLMEngine(EngineConfig(model={path!r}, max_model_len=2048, **DEFAULTS.native.given()))
""",
    "llamacpp": """
import time; t0 = time.perf_counter()
import llama_cpp
t1 = time.perf_counter()
llama_cpp.Llama(model_path={path!r}, n_ctx=2048, verbose=False)
""",
}
_REPORT = "\nimport json; print(json.dumps({'import_s': t1 - t0, 'construct_s': time.perf_counter() - t1}))\n"


def make_store(gguf: Path, home: Path) -> None:
    """`smollm2:135m` in a fresh store under ``home`` (greedy, 4 tokens: the answer is not what is timed)."""
    from registry.create import create_model
    from registry.modelfile import parse_modelfile
    from registry.names import parse_name
    from registry.store import Store

    modelfile = f"FROM {gguf}\nPARAMETER temperature 0\nPARAMETER num_predict 4\n"
    create_model(Store(home / "models"), parse_name(MODEL), parse_modelfile(modelfile), home)


def base_env(home: Path, root: Path = ROOT) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFER_", "OLLAMA_", "PYTHONPATH"))}
    env.update(INFER_HOME=str(home), PYTHONPATH=str(root))
    return env


def infer_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli", *args]


def run_once(engine: str, env: dict[str, str]) -> dict[str, float]:
    """`infer run --local --verbose`: spawn -> first answer byte, and the load duration it reports."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(infer_cmd("run", MODEL, "hi", "--engine", engine, "--local", "--verbose"), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    first = proc.stdout.read(1)
    first_s = time.perf_counter() - t0
    out, err = proc.communicate(timeout=300)
    if proc.returncode or not first:
        raise RuntimeError(f"infer run --engine {engine} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return {"first_byte_s": first_s, "load_s": _verbose_seconds(err.decode(), "load duration")}


def _verbose_seconds(text: str, label: str) -> float:
    """A duration from `--verbose` output: `load duration:        1.23s` (Go's format: ns, µs, ms, s, m)."""
    line = next(ln for ln in text.splitlines() if ln.startswith(label + ":"))
    value = line.split(":", 1)[1].strip()
    for unit, scale in (("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9), ("s", 1.0)):
        if value.endswith(unit):
            return float(value[: -len(unit)]) * scale
    raise ValueError(f"cannot read {label!r} from {line!r}")


def serve_once(engine: str, env: dict[str, str], tmp: Path, idle_s: float = 0.0, root: Path = ROOT) -> dict[str, float]:
    """`infer serve`: spawn -> HTTP up, then (``idle_s`` later) the first /api/generate's load_duration
    and its end."""
    port = free_port()
    env = {**env, "INFER_HOST": f"127.0.0.1:{port}", "INFER_ENGINE": engine}
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    with open(tmp / f"serve-{engine}.log", "wb") as log:
        proc = subprocess.Popen(infer_cmd("serve", "--log-level", "warning"), env=env, stdout=log,
                                stderr=subprocess.STDOUT, cwd=root)
    try:
        up_s = _wait_http(url, proc, t0)
        time.sleep(idle_s)
        body = {"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 1}}
        reply = _post(url + "/api/generate", body)
        answered_s = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"http_up_s": up_s, "load_s": reply["load_duration"] / 1e9, "first_answer_s": answered_s}


def _wait_http(url: str, proc: subprocess.Popen, t0: float) -> float:
    while True:
        try:
            with urllib.request.urlopen(url + "/", timeout=1):
                return time.perf_counter() - t0
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"infer serve exited with {proc.returncode}") from None
            time.sleep(0.02)


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())



def engine_once(engine: str, env: dict[str, str], gguf: Path) -> dict[str, float]:
    """The engine in a fresh Python: import seconds and construction seconds."""
    code = ENGINE_ALONE[engine].format(path=str(gguf)) + _REPORT
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=False)
    if out.returncode:
        raise RuntimeError(f"{engine} engine load failed: {out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {**result, "total_s": result["import_s"] + result["construct_s"]}


def others_cores(fn):
    """Run ``fn``; return its result and the mean number of cores other processes kept busy meanwhile
    (this process's children, the measured commands, excluded)."""
    def ticks() -> tuple[int, int]:
        with open("/proc/stat") as f:
            busy = sum(int(v) for i, v in enumerate(f.readline().split()[1:9]) if i != 3)
        t = os.times()
        return busy, round((t.user + t.system + t.children_user + t.children_system) * os.sysconf("SC_CLK_TCK"))

    a, t0 = ticks(), time.perf_counter()
    result = fn()
    b, seconds = ticks(), time.perf_counter() - t0
    return result, max(0, (b[0] - a[0]) - (b[1] - a[1])) / os.sysconf("SC_CLK_TCK") / seconds


ROWS = [  # (label, section, field)
    ("infer run: spawn -> first answer byte", "run", "first_byte_s"),
    ("infer run: load duration (--verbose)", "run", "load_s"),
    ("infer serve: spawn -> HTTP up", "serve", "http_up_s"),
    ("infer serve: first /api/generate load_duration", "serve", "load_s"),
    ("infer serve: spawn -> first answer", "serve", "first_answer_s"),
    (f"infer serve: load_duration, request {IDLE_S:g} s after up", "serve_idle", "load_s"),
    ("engine alone: import", "engine", "import_s"),
    ("engine alone: construct", "engine", "construct_s"),
    ("engine alone: import + construct", "engine", "total_s"),
]


def report(results: dict, busy: list[float], runs: int) -> dict:
    print(f"\nSmolLM2-135M-Instruct Q4_1, medians of {runs} runs (seconds; others used "
          f"{statistics.median(busy):.2f} cores on average, max {max(busy):.2f})")
    print(f"{'':48} {'native':>8} {'llama.cpp':>10} {'ratio':>7}")
    table = {}
    for label, section, key in ROWS:
        ours, theirs = (statistics.median(r[key] for r in results[e][section]) for e in ENGINES)
        table[label] = {"native": ours, "llamacpp": theirs, "ratio": ours / theirs if theirs else None}
        print(f"{label:48} {ours:8.3f} {theirs:10.3f} {ours / theirs if theirs else float('nan'):6.1f}x")
    print(f"\ngoal: native load_duration <= {GOAL_S:.1f} s")
    for label in ("infer serve: first /api/generate load_duration", "infer run: load duration (--verbose)",
                  f"infer serve: load_duration, request {IDLE_S:g} s after up"):
        load = table[label]["native"]
        verdict = "met" if load <= GOAL_S else f"MISSED by {load - GOAL_S:.2f} s"
        print(f"  {label}: {load:.2f} s, {verdict}")
    return table


def against_baseline(baseline: Path, gguf: Path, runs: int) -> dict:
    """``infer serve`` spawn -> first answer: this tree vs ``baseline``, per engine, alternating."""
    found: dict[str, dict[str, list[float]]] = {e: {"today": [], "runners": []} for e in ENGINES}
    with tempfile.TemporaryDirectory(prefix="native-load-") as tmp_name:
        tmp = Path(tmp_name)
        make_store(gguf, tmp / "home")
        trees = {"today": baseline.resolve(), "runners": ROOT}
        for i in range(runs):
            for engine in ENGINES:
                for side in (("today", "runners") if i % 2 == 0 else ("runners", "today")):
                    env = base_env(tmp / "home", trees[side])
                    seconds = serve_once(engine, env, tmp, root=trees[side])["first_answer_s"]
                    found[engine][side].append(seconds)
                    print(f"run {i + 1} {engine:8} {side:7} spawn -> first answer {seconds:.3f} s", flush=True)
    print(f"\ninfer serve: spawn -> first answer, medians of {runs} runs (seconds)")
    print(f"{'engine':9} {'today':>8} {'runners':>8} {'ratio':>7}  goal <= 1.10x")
    table = {}
    for engine, sides in found.items():
        a, b = statistics.median(sides["today"]), statistics.median(sides["runners"])
        table[engine] = {"today": a, "runners": b, "ratio": b / a}
        print(f"{engine:9} {a:8.3f} {b:8.3f} {b / a:6.3f}x  {'met' if b / a <= 1.10 else 'MISSED'}")
    return {"runs": found, "medians": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", type=Path, metavar="DIR", help="compare infer serve's start with this tree's")
    parser.add_argument("--json", type=Path, help="write the raw runs and the table here")
    args = parser.parse_args()
    from registry.realmodels import fetch_smollm2

    gguf = fetch_smollm2()
    if args.baseline is not None:
        result = against_baseline(args.baseline, gguf, args.runs)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=2))
        return
    results: dict[str, dict[str, list]] = {e: {"run": [], "serve": [], "serve_idle": [], "engine": []}
                                           for e in ENGINES}
    busy: list[float] = []
    with tempfile.TemporaryDirectory(prefix="native-load-") as tmp_name:
        tmp = Path(tmp_name)
        make_store(gguf, tmp / "home")
        env = base_env(tmp / "home")
        for i in range(args.runs):
            for engine in ENGINES:
                (row, cores) = others_cores(lambda: {
                    "run": run_once(engine, env), "serve": serve_once(engine, env, tmp),
                    "serve_idle": {"load_s": serve_once(engine, env, tmp, IDLE_S)["load_s"]},
                    "engine": engine_once(engine, env, gguf)})
                busy.append(cores)
                for section, values in row.items():
                    results[engine][section].append(values)
                print(f"run {i + 1} {engine:8} " + "  ".join(f"{s}.{k}={v:.3f}" for s, vals in row.items()
                                                            for k, v in vals.items()) + f"  (others {cores:.2f} cores)",
                      flush=True)
    table = report(results, busy, args.runs)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": results, "others_cores": busy, "medians": table}, indent=2))


if __name__ == "__main__":
    main()
