#!/usr/bin/env bash
# Offline end-to-end demo: everything printed is the real output of the commands shown.
#   1. fetch SmolLM2-135M-Instruct (a real, trained Apache-2.0 model, Q4_1 GGUF) once into ~/.cache/infer
#   2. import it with `infer create` as smollm2:135m (a publisher's store)
#   3. start `infer registry serve` on a free loopback port and `infer push` the model to it
#   4. `infer pull` it into a fresh INFER_HOME, then `infer list` and `infer show`
#   5. `infer run --verbose --local` answers one prompt on each engine; `infer serve` starts on a free port; the
#      official `openai` client streams a chat; curl calls /api/chat; `infer run` goes through the server and
#      `infer ps` shows the model loaded there; `infer usage` shows the ledger
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="$PWD/.demo"
rm -rf "$WORK" && mkdir -p "$WORK"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
REG="127.0.0.1:$PORT"

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

export INFER_HOME="$WORK/publisher"
step infer dev fetch-model
GGUF=$(infer dev fetch-model | cut -d' ' -f1)
cat > "$WORK/Modelfile" <<EOF
FROM $GGUF
PARAMETER temperature 0
PARAMETER num_ctx 2048
PARAMETER num_predict 96
LICENSE """Apache License 2.0 (SmolLM2-135M-Instruct, Hugging Face)"""
EOF
step infer create smollm2:135m -f "$WORK/Modelfile"

infer registry serve --root "$WORK/registry" --port "$PORT" > "$WORK/registry.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -fs "http://$REG/v2/" >/dev/null && break; sleep 0.1; done
printf '\n(registry serving %s at http://%s, pid %s)\n' "$WORK/registry" "$REG" "$SERVER"

step infer cp smollm2:135m "$REG/library/smollm2:135m"
step infer push "$REG/library/smollm2:135m" --insecure

export INFER_HOME="$WORK/consumer"
step infer pull "$REG/library/smollm2:135m" --insecure
step infer list
step infer show "$REG/library/smollm2:135m"
step infer show "$REG/library/smollm2:135m" --modelfile

kill "$SERVER" && wait "$SERVER" 2>/dev/null || true
trap - EXIT
printf '\n(registry stopped)\n'

MODEL="$REG/library/smollm2:135m"
step infer run "$MODEL" "What is the capital of France?" --verbose --engine native --local
step infer run "$MODEL" "What is the capital of France?" --verbose --local

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
    max_tokens=48, seed=7, stream=True, stream_options={"include_usage": True})
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
    if chunk.usage:
        print(f"\n[usage: {chunk.usage.prompt_tokens} prompt + {chunk.usage.completion_tokens} completion tokens]")
PY

step curl -s "http://$INFER_HOST/api/chat" -d "{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"Why is the sky blue?\"}], \"options\": {\"num_predict\": 48}, \"stream\": false}"

step infer run "$MODEL" "What is the capital of France?" --verbose   # through infer serve: the model stays warm
step infer ps
step infer usage

kill "$API" && wait "$API" 2>/dev/null || true
trap - EXIT
printf '\nservers stopped; demo files in %s\n' "$WORK"

# ---------------------------------------------------------------------------------------------------------------
# infer bench and infer estimate: load-test `infer serve` with vLLM's metrics, then predict a bigger deployment
# from that measurement (MFU/MBU calibrated on this machine's CPU).
# ---------------------------------------------------------------------------------------------------------------
BENCH_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
INFER_HOST="127.0.0.1:$BENCH_PORT" infer serve > "$WORK/serve-bench.log" 2>&1 &
API=$!
trap 'kill $API 2>/dev/null || true' EXIT
for _ in $(seq 200); do curl -fs "http://127.0.0.1:$BENCH_PORT/" >/dev/null && break; sleep 0.1; done
step infer bench --url "http://127.0.0.1:$BENCH_PORT" --model "$MODEL" --profile synchronous --num-requests 5 \
  --input-tokens 64 --output-tokens 32 --goodput "ttft:2000 tpot:200" --price-per-hour 0.50 --out "$WORK/bench"
step infer estimate "$MODEL" --device cpu --calibrate "$WORK/bench" --input-tokens 512 --output-tokens 128 \
  --slo ttft:2000,tpot:200 --rate 1 --price-per-hour 0.50
kill "$API" && wait "$API" 2>/dev/null || true
trap - EXIT
printf '\nbench outputs (requests.jsonl, summary.json, summary.csv, PNG plots) in %s\n' "$WORK/bench"
