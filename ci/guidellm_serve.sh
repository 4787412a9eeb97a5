#!/usr/bin/env bash
# guidellm, a third-party load generator, against `kvbench serve`: both endpoints at 1 and 4
# concurrent streams, synthetic prompts. Checks that every request succeeded with exactly the
# output tokens asked, and prints guidellm's output tok/s per level (compare with the stress
# benchmark's, reports/stress, on the same machine).
#
#   ci/guidellm_serve.sh [METHOD [PARAMS_JSON]]     e.g. ci/guidellm_serve.sh turbo '{"bits": 3, "block": 64}'
#
# guidellm pins its own dependencies, so it lives in its own environment: GUIDELLM names its
# executable, else it is installed once into .guidellm-venv (package registry only). The server
# is the bundled SmolLM2-135M, served by its prepared folder so that guidellm's tokenizer (the
# request's model field) is that same local folder: nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
METHOD=${1:-identity}
PARAMS=${2:-"{}"}
PY=.venv/bin/python
if [ -z "${GUIDELLM:-}" ]; then
  [ -x .guidellm-venv/bin/guidellm ] || { python3 -m venv .guidellm-venv &&
    .guidellm-venv/bin/pip install -q "guidellm==0.8.1"; }
  GUIDELLM=.guidellm-venv/bin/guidellm
fi
MODEL=$($PY -c "from kvbench.models.bundled import prepared_dir; print(prepared_dir('smollm2-135m', log=lambda m: None))")
PORT=$($PY -c "from kvbench.benchmarks.measure.servers import free_port; print(free_port())")
OUT=$(mktemp -d)
$PY -m kvbench.cli serve --model "$MODEL" --method "$METHOD" --params "$PARAMS" --port "$PORT" \
  --threads 2 > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
  kill -0 $SERVER 2>/dev/null || { cat "$OUT/serve.log"; exit 1; }
  sleep 1
done
status=0
for FORMAT in /v1/completions /v1/chat/completions; do
  for STREAMS in 1 4; do
    NAME=$(echo "$FORMAT" | tr / _)-$STREAMS
    HF_HUB_OFFLINE=1 "$GUIDELLM" run \
      --backend "kind=openai_http,target=http://127.0.0.1:$PORT,model=$MODEL,request_format=$FORMAT" \
      --profile "kind=concurrent,streams=$STREAMS" --constraint "kind=max_requests,count=$((2 * STREAMS))" \
      --data kind=synthetic_text,prompt_tokens=128,output_tokens=32 \
      --output "kind=json,path=$OUT/$NAME.json" --disable-console > "$OUT/$NAME.log" 2>&1
    $PY - "$OUT/$NAME.json" "$FORMAT" "$STREAMS" <<'CHECK' || status=1
import json, sys
path, fmt, streams = sys.argv[1], sys.argv[2], int(sys.argv[3])
bench = json.load(open(path))["benchmarks"][0]
requests = bench["requests"]
ok, bad = requests["successful"], requests["errored"] + requests["incomplete"]
tokens = sorted({r["output_metrics"]["text_tokens"] for r in ok})
rate = bench["metrics"]["output_tokens_per_second"]["successful"]["mean"]
print(f"{fmt} at {streams} streams: {len(ok)} ok, {len(bad)} failed, output tokens per"
      f" request {tokens}, output {rate:.1f} tok/s (guidellm's mean)")
sys.exit(0 if ok and not bad and tokens == [32] else 1)
CHECK
  done
done
[ $status = 0 ] && echo "guidellm: every request answered" || { echo "guidellm: failures, see $OUT"; exit 1; }
