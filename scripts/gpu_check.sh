#!/usr/bin/env bash
# The native engine's GPU checks in one call of about four minutes, on a lent H100/H200 machine:
#   1. the carried wheels (.whl/: llguidance, gguf; the machine has torch, triton, transformers, numpy,
#      tokenizers, safetensors, pyyaml) into /tmp/site;
#   2. pytest -m gpu tests/native_engine (Triton kernels, CUDA graphs, the sampler on the device, one
#      host copy per decode step, structured outputs), at most GPU_TESTS_S seconds;
#   3. bench/native_gpu.py (Qwen2-0.5B and 7B shapes, random bf16 drawn on the device; warm-ups, repeats and
#      the decode profiles inside a budget of BENCH_S - 90 seconds, then the mixed workload with the unified
#      attention kernel on vs off, batch 1 with the fused decode kernels on vs off, then the n-gram speculative
#      decoding pass), killed at BENCH_S;
#   4. a short summary table, last.
# Logs and the bench's JSON go to $OUT when it is set (the device tool brings them back), else .bench/gpu/.
# Run from the repository root:  bash scripts/gpu_check.sh   (GPU_TESTS_S=90 BENCH_S=260 by default)
# With AMX_SRC=path/to/llama-cpp-python.tar.gz (and AMX_WHEELS=dir), scripts/amx_check.sh builds llama.cpp
# for this CPU and runs its smoke test while the GPU tests run (nothing is timed then), before the bench.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-.bench/gpu}"
mkdir -p "$OUT"
GPU_TESTS_S="${GPU_TESTS_S:-90}"
BENCH_S="${BENCH_S:-260}"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee "$OUT/device.txt"
python3 -c "import torch, triton, transformers, llguidance, gguf; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'llguidance', llguidance.__version__)" 2>&1 | tee -a "$OUT/device.txt"

amx_pid=
if [ -n "${AMX_SRC:-}" ]; then
  OUT="$OUT/amx" ONLY="${AMX_ONLY:-fixed}" JOBS="${AMX_JOBS:-12}" timeout 300 bash scripts/amx_check.sh "$AMX_SRC" "${AMX_WHEELS:-}" >"$OUT/amx_check.log" 2>&1 &
  amx_pid=$!
fi
start=$(date +%s)
timeout "$GPU_TESTS_S" python3 -m pytest -m gpu tests/native_engine -q -p no:cacheprovider \
  --timeout 120 2>&1 | tee "$OUT/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}
tests_s=$(( $(date +%s) - start ))
[ -z "$amx_pid" ] || wait "$amx_pid"

start=$(date +%s)
timeout "$BENCH_S" python3 bench/native_gpu.py --budget-s $(( BENCH_S - 90 )) --unified --fused --speculative --json "$OUT/native_gpu.json" 2>&1 \
  | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}
bench_s=$(( $(date +%s) - start ))

echo
echo "== summary: gpu tests rc=$tests_rc in ${tests_s}s: $(tail -1 "$OUT/gpu_tests.log")"
echo "== bench rc=$bench_rc in ${bench_s}s"
[ ! -f "$OUT/amx/amx.txt" ] || { echo "== llama.cpp on this CPU (scripts/amx_check.sh):"; cat "$OUT/amx/amx.txt"; }
python3 - "$OUT/native_gpu.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    sys.exit(f"no bench JSON: {exc}")
print(f"{r['device']}: copy bandwidth {r['copy_bandwidth'] / 1e12:.2f} TB/s, bench {r.get('elapsed_s', 0):.0f} s")
print(f"{'model':5s} {'b1 tok/s':>9s} {'b1 MBU':>7s} {'b1 smp/gr':>9s} {'uni x hf':>9s} {'mix x hf':>9s} "
      f"{'uni smp/gr':>10s} {'mix smp/gr':>10s} {'b1 step us':>10s} {'b1 busy':>8s}")
for shape, m in r["models"].items():
    o, h = m.get("ours"), m.get("hf", {})
    if not o or "single_greedy" not in o:
        print(f"{shape:5s} ours failed: {m.get('ours_error', '?').strip().splitlines()[-1]}")
        continue
    x = lambda k: f"{o[k]['tok_s'] / h[k]['tok_s']:.1f}" if k in h else "-"
    g = lambda k: o[f"{k}_sampled"]["tok_s"] / o[f"{k}_greedy"]["tok_s"]
    b1 = o["single_greedy"]
    p = o.get("profile", {}).get("decode_b1_greedy", {})
    print(f"{shape:5s} {b1['decode_tok_s']:9.0f} {b1['mbu']:7.1%} "
          f"{o['single_sampled']['decode_tok_s'] / b1['decode_tok_s']:9.2f} "
          f"{x('uniform_greedy') + '/' + x('uniform_sampled'):>9s} {x('mixed_greedy') + '/' + x('mixed_sampled'):>9s} "
          f"{g('uniform'):10.2f} {g('mixed'):10.2f} {p.get('wall_us', float('nan')):10.0f} "
          f"{p.get('busy_us', float('nan')):8.0f}")
    if "ahead_failed" in o:
        print(f"{shape:5s} scheduling ahead failed (measured without): {o['ahead_failed'].strip().splitlines()[-1]}")
uni = r.get("unified")
if uni:
    print("unified attention (0.5b, 64 mixed greedy; eager, with mixed-step graphs, vs per chunk):", uni.get("error") or
          f"{uni['unified']['tok_s']:.0f}, {uni.get('unified_graphs', {}).get('tok_s', float('nan')):.0f} vs "
          f"{uni['per_chunk']['tok_s']:.0f} tok/s = {uni['ratio']:.2f}x, {uni.get('graphs_ratio', float('nan')):.2f}x; "
          f"TTFT p50 {uni['unified']['ttft_ms_p50']:.0f}, {uni.get('unified_graphs', {}).get('ttft_ms_p50', float('nan')):.0f} "
          f"vs {uni['per_chunk']['ttft_ms_p50']:.0f} ms")
fused = r.get("fused")
if fused:
    print("fused decode (0.5b, batch 1 greedy, fused_decode on vs off):", fused.get("error") or
          f"{fused['fused_tok_s']:.0f} vs {fused['unfused_tok_s']:.0f} tok/s = {fused['ratio']:.2f}x, active "
          f"{fused['fused_active']}, same tokens {fused['same_tokens']:.0%}")
spec = r.get("speculative")
if spec:
    print("speculative (0.5b, ngram k=4, batch 1 greedy):", spec.get("error") or
          f"{spec['spec_tok_s']:.0f} vs {spec['plain_tok_s']:.0f} tok/s = {spec['ratio']:.2f}x, acceptance "
          f"{spec['acceptance_rate'] or 0:.0%}, tokens equal {spec['greedy_equal']}")
print("goals: 0.5b b1 >= 1500 tok/s; 7b b1 MBU >= 75%; mixed >= 20x hf, uniform >= 15x (greedy/sampled); "
      "sampled within 10% of greedy")
PY
