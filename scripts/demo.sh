#!/usr/bin/env bash
# Offline end-to-end demo: everything printed is the real output of the commands shown.
#   1. build a small deterministic model (random weights, trained BPE tokenizer) as GGUF
#   2. import it with `infer create` (a publisher's store)
#   3. start `infer registry serve` on a free loopback port and `infer push` the model to it
#   4. `infer pull` it into a fresh INFER_HOME, then `infer list` and `infer show`
#   5. `infer run --verbose` answers one prompt; `infer serve` starts on a free port; the official
#      `openai` client streams a chat; curl calls /api/chat; `infer usage` shows the ledger
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
printf '\n(registry stopped)\n'

MODEL="$REG/library/tiny-qwen2"
step infer run "$MODEL" "Say hello in five words." --verbose
step infer run "$MODEL" "Say hello in five words." --verbose --engine native

API_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export INFER_HOST="127.0.0.1:$API_PORT"
infer serve > "$WORK/serve.log" 2>&1 &
API=$!
trap 'kill $API 2>/dev/null || true' EXIT
for _ in $(seq 200); do curl -fs "http://$INFER_HOST/" >/dev/null && break; sleep 0.1; done
printf '\n(infer serve at http://%s, pid %s)\n' "$INFER_HOST" "$API"

printf '\n\033[1m$ python (openai client, streaming)\033[0m\n'
python - "$INFER_HOST" "$MODEL" <<'PY'
import sys
from openai import OpenAI

host, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=f"http://{host}/v1", api_key="infer")
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Tell me a joke."}],
    max_tokens=24, seed=7, stream=True, stream_options={"include_usage": True})
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
    if chunk.usage:
        print(f"\n[usage: {chunk.usage.prompt_tokens} prompt + {chunk.usage.completion_tokens} completion tokens]")
PY

step curl -s "http://$INFER_HOST/api/chat" -d "{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"Why is the sky blue?\"}], \"options\": {\"num_predict\": 6, \"seed\": 1}}"

step infer usage

kill "$API" && wait "$API" 2>/dev/null || true
trap - EXIT
printf '\nservers stopped; demo files in %s\n' "$WORK"
