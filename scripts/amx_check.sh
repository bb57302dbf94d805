#!/usr/bin/env bash
# Does llama.cpp answer on this CPU, built as pip builds it and as `make install` builds it?
#
# For a machine without network whose CPU has AMX (a lent GPU box's Xeon): builds llama-cpp-python from a
# source tarball twice, with pip's default flags (GGML_NATIVE=ON) and with the flags
# adapters/engines/llamacpp/cpu_build.py chooses for this CPU (what scripts/install_llama_cpp.py installs),
# then runs the smoke test (a Q4_0 model, a prompt of several tokens) in a child process with each.
# Both builds leave out the multimodal library (-DLLAVA_BUILD=OFF), which the smoke test does not use.
#
#   bash scripts/amx_check.sh SOURCE.tar.gz [WHEELS_DIR]
#
# ONLY="fixed native" (the default) names the builds, run side by side (JOBS shared): fixed, native, and to
# find which code path crashes, noavx512 (fixed with the AVX-512 family off: AVX2 kernels only) and
# nollamafile (fixed with -DGGML_LLAMAFILE=OFF: no tinyBLAS sgemm for prompt batches). The smoke tests run
# with Python's faulthandler, so a crash leaves the Python stack in smoke-NAME.log.
# SOURCE: llama-cpp-python's sdist (models/ and docs/ may be stripped to travel); WHEELS_DIR: wheels of
# what the smoke test imports and the machine lacks (gguf, diskcache). Logs go to $OUT (or .bench/amx).
set -uo pipefail
cd "$(dirname "$0")/.."
SRC="$1"
WHEELS="${2:-}"
OUT="${OUT:-.bench/amx}"
JOBS="${JOBS:-$(nproc)}"
mkdir -p "$OUT"
work=$(mktemp -d /tmp/amx-check.XXXXXX)
tar xzf "$SRC" -C "$work"
src=$(ls -d "$work"/llama_cpp_python-*)
site="$work/deps"
if [ -n "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl || exit 1
fi
export PYTHONPATH="$site:$PWD"

grep -m1 'model name' /proc/cpuinfo | tee "$OUT/amx.txt"
{ gcc --version | head -1; env | grep -E '^(LDFLAGS|CFLAGS|CXXFLAGS|CMAKE_ARGS)=' ; } | tee -a "$OUT/amx.txt"
echo "cpu flags with amx: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -c '^amx')" | tee -a "$OUT/amx.txt"
fixed=$(python3 -c "
from pathlib import Path
from adapters.engines.llamacpp.cpu_build import cpu_flags, explicit_args
print(' '.join(explicit_args(cpu_flags(Path('/proc/cpuinfo').read_text()))))")

build() {  # build NAME CMAKE_ARGS: a wheel into $work/NAME, installed into $work/NAME/site
  local name=$1 args=$2 start
  start=$(date +%s)
  cp -r "$src" "$work/src-$name"  # builds side by side do not share a build directory
  CMAKE_ARGS="$args -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
    python3 -m pip wheel -q --no-build-isolation --no-deps --no-index "$work/src-$name" -w "$work/$name" \
    >"$OUT/build-$name.log" 2>&1 || { echo "$name: build failed (see build-$name.log)"; return 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$work/$name/site" "$work/$name"/*.whl \
    >>"$OUT/build-$name.log" 2>&1 || { echo "$name: install failed"; return 1; }
  echo "$name: built in $(( $(date +%s) - start )) s with CMAKE_ARGS='$args'" | tee -a "$OUT/amx.txt"
}

smoke() {  # smoke NAME: the smoke test in a child process with that build first on the path
  PYTHONPATH="$work/$1/site:$PYTHONPATH" python3 -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())" \
    >"$OUT/system-$1.txt" 2>&1
  PYTHONPATH="$work/$1/site:$PYTHONPATH" timeout 120 python3 -X faulthandler -m adapters.engines.llamacpp.smoke \
    >"$OUT/smoke-$1.log" 2>&1
  local rc=$?
  echo "$1: smoke test exit status $rc ($(tail -1 "$OUT/smoke-$1.log"))" | tee -a "$OUT/amx.txt"
  if [ "$rc" != 0 ]; then  # a static C++ runtime in each library crashed every build on one GPU box at load
    local lib; lib=$(gcc -print-file-name=libstdc++.so.6)
    LD_PRELOAD="$lib" PYTHONPATH="$work/$1/site:$PYTHONPATH" timeout 120 python3 -m adapters.engines.llamacpp.smoke \
      >"$OUT/smoke-$1-preload.log" 2>&1
    echo "$1: with LD_PRELOAD=$lib: exit status $? ($(tail -1 "$OUT/smoke-$1-preload.log"))" | tee -a "$OUT/amx.txt"
    ldd "$work/$1/site/llama_cpp/lib/libllama.so" | grep -E "stdc|gomp" | tee -a "$OUT/amx.txt"
  fi
}

args_for() {
  case $1 in
    fixed) echo "$fixed" ;;
    native) echo "" ;;
    noavx512) echo "$fixed" | sed -E 's/-DGGML_AVX512(_[A-Z0-9]+)?=ON/-DGGML_AVX512\1=OFF/g' ;;
    nollamafile) echo "$fixed -DGGML_LLAMAFILE=OFF" ;;
    *) echo "unknown build $1" >&2; return 1 ;;
  esac
}
variants=(${ONLY:-fixed native})
JOBS=$(( JOBS / ${#variants[@]} > 0 ? JOBS / ${#variants[@]} : 1 ))
for v in "${variants[@]}"; do
  { args=$(args_for "$v") && build "$v" "$args" && smoke "$v"; } &
done
wait
echo "(exit status 139 or -11: SIGSEGV)" | tee -a "$OUT/amx.txt"
rm -rf "$work"
