#!/usr/bin/env bash
# The Triton kernels on a GPU machine that reaches no package registry, in one device call:
# tests/test_kernels.py there (GPU-only tests included), then suites/cuda.yaml (codec speed
# and the fused decode attention against SDPA), its report and results put under $OUT.
#
#   here:  ci/cuda_kernels.sh --pack     (the wheels the device image lacks, into .whl)
#   call:  carry .whl, run ci/cuda_kernels.sh
# Environment: OUT (default runs/cuda-kernels-out), PYTHON (python3), TEST_S and SUITE_S (the
# seconds each step may take, 240 and 300), SUITE (suites/cuda.yaml).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-runs/cuda-kernels-out}
SUITE=${SUITE:-suites/cuda.yaml}
SITE=/tmp/kvbench-site
# kvbench's own dependencies the device image (torch, triton, numpy, pyyaml, click, rich,
# pytest, hypothesis, ...) lacked on 2026-11-28
DEVICE_LACKS="pydantic pydantic-core annotated-types typing-inspection typing-extensions
  wonderwords"
export PYTHONUNBUFFERED=1

if [ "${1:-}" = "--pack" ]; then
  pins=()
  for name in $DEVICE_LACKS; do
    pins+=("$name==$($PYTHON -c "import importlib.metadata as m; print(m.version('$name'))")")
  done
  exec $PYTHON -m pip download -q --no-deps --only-binary=:all: -d .whl --implementation cp \
    --python-version "${DEVICE_PYTHON:-3.12}" --platform manylinux2014_x86_64 "${pins[@]}"
fi
mkdir -p "$OUT" "$SITE"
if compgen -G ".whl/*.whl" >/dev/null; then
  $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl || { echo "wheel install failed" >&2; exit 1; }
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  $PYTHON -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__,
"cuda", torch.cuda.is_available())'
} 2>&1 | tee "$OUT/env.txt"
timeout "${TEST_S:-240}" $PYTHON -m pytest -q -p no:cacheprovider -m "gpu or not gpu" \
  tests/test_kernels.py 2>&1 | tee "$OUT/tests.log" | tail -25
run=/tmp/kvbench-$(basename "$SUITE" .yaml)
timeout -s INT "${SUITE_S:-300}" $PYTHON -m kvbench.cli run "$SUITE" --out "$run" \
  > "$OUT/run.log" 2>&1
echo "kvbench run exit $?"
tail -5 "$OUT/run.log"
cp "$run"/results.json "$run"/report.md "$OUT"/ 2>/dev/null
ls "$OUT"
