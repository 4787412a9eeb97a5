#!/usr/bin/env bash
# The Triton kernels on a GPU machine that reaches no package registry, in one device call:
# tests/test_kernels.py there (the GPU-only tests first, then the rest compiled), then
# suites/cuda.yaml (codec speed and the fused decode attention against SDPA), its report and
# results put under $OUT. The first two steps of ci/gpu_session.sh, which this runs.
#
#   here:  ci/cuda_kernels.sh --pack     (the wheels the device image lacks, into .whl)
#   call:  carry .whl, run ci/cuda_kernels.sh
# Environment: OUT (default runs/cuda-kernels-out), TEST_S and SUITE_S (each step's share of the
# call, 240 and 300 seconds; what the tests leave unused passes to the suite), SUITE
# (suites/cuda.yaml), and ci/device_env.sh's (PYTHON, WHEELS, SITE, GRACE_S).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--pack" ]; then
  source ci/device_env.sh
  device_pack
  exit
fi
TEST_S=${TEST_S:-240} SUITE_S=${SUITE_S:-300}
export OUT=${OUT:-runs/cuda-kernels-out} BUDGET_S=$((TEST_S + SUITE_S + 10)) END_S=10
export PLAN="kernels tests tests/test_kernels.py $TEST_S -
cuda suite ${SUITE:-suites/cuda.yaml} $SUITE_S -"
exec ci/gpu_session.sh "$@"
