#!/usr/bin/env bash
# Offline end-to-end demo: everything printed is the real output of the commands shown.
#   1. build a small deterministic model (random weights, trained BPE tokenizer) as GGUF
#   2. import it with `infer create` (a publisher's store)
#   3. start `infer registry serve` on a free loopback port and `infer push` the model to it
#   4. `infer pull` it into a fresh INFER_HOME, then `infer list` and `infer show`
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="$PWD/.demo"
rm -rf "$WORK" && mkdir -p "$WORK"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
REG="127.0.0.1:$PORT"

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

export INFER_HOME="$WORK/publisher"
step infer dev make-model --preset tiny-qwen2 --format gguf --dtype f16 --out "$WORK/tiny-qwen2.gguf"
cat > "$WORK/Modelfile" <<'EOF'
FROM ./tiny-qwen2.gguf
PARAMETER temperature 0.7
PARAMETER num_ctx 512
PARAMETER stop "<|im_end|>"
SYSTEM """You are a concise assistant."""
LICENSE """Apache License 2.0 (demo model with random weights)"""
EOF
step infer create tiny-qwen2 -f "$WORK/Modelfile"

infer registry serve --root "$WORK/registry" --port "$PORT" > "$WORK/registry.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -fs "http://$REG/v2/" >/dev/null && break; sleep 0.1; done
printf '\n(registry serving %s at http://%s, pid %s)\n' "$WORK/registry" "$REG" "$SERVER"

step infer cp tiny-qwen2 "$REG/library/tiny-qwen2:latest"
step infer push "$REG/library/tiny-qwen2:latest" --insecure

export INFER_HOME="$WORK/consumer"
step infer pull "$REG/library/tiny-qwen2" --insecure
step infer list
step infer show "$REG/library/tiny-qwen2"
step infer show "$REG/library/tiny-qwen2" --modelfile

kill "$SERVER" && wait "$SERVER" 2>/dev/null || true
trap - EXIT
printf '\nregistry stopped; demo files in %s\n' "$WORK"
