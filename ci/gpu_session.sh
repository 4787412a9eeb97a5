#!/usr/bin/env bash
# A GPU session's device time in one command: the steps of PLAN in order of value, each with its
# share of one call's budget, each stopped cleanly at its share (finished cases kept), the next
# still getting its own. How a session uses it: docs/gpu-session.md.
#
#   ci/gpu_session.sh             setup (carried wheels, environment, GGUF parts), then the plan
#   ci/gpu_session.sh --check     setup only: the short first call that brings a GGUF part
#   ci/gpu_session.sh --dry-run   the plan, and what each suite would keep and run (runs nothing)
#   ci/gpu_session.sh --pack      here: the wheels and the GGUF parts to carry (ci/device_env.sh)
#
# The plan (PLAN: one step a line, "name kind target weight seed"; STEPS="name ..." keeps only
# those steps, in the plan's order):
#   kernels        tests        tests/test_kernels.py      120  -
#   cuda           suite        suites/cuda.yaml            90  -
#   cuda-e2e       model-suite  suites/cuda-e2e.yaml       300  reports/cuda-e2e/results.jsonl
#   cuda-e2e-bf16  model-suite  suites/cuda-e2e-bf16.yaml    0  reports/cuda-e2e-bf16/results.jsonl
# tests: pytest TARGET -m gpu (the cases only a GPU runs), then -m "not gpu and not slow" (the
#   interpreter's cases, compiled). suite: kvbench run TARGET --out RUN_ROOT/kvbench-NAME
#   --resume; the suite's own order is the order its cases run in. model-suite: the same, after
#   the bundled model is prepared from the carried GGUF (in the step's time). seed: a committed
#   results.jsonl that the run folder starts from when it holds none (and when it was run on
#   DEVICE), so that --resume skips what was measured before; "-" for none.
# Time: each step, when it starts, gets the time then left (BUDGET_S from the start, less END_S)
# in proportion of its weight to the weights of the steps from it on, so what a step leaves unused
# passes on; weight 0 (last) means "what the others leave". At its share less GRACE_S a step is
# stopped as Ctrl-C stops it (SIGINT), GRACE_S later killed (results.jsonl keeps every finished
# case even then); a step whose share is under MIN_S is skipped. Setup counts against BUDGET_S.
# Environment: OUT (what comes back: session.log, summary.txt, env.txt and a folder per step with
# its logs, results.json(l), report.md; default runs/gpu-session-out), BUDGET_S (540: under a
# device call's 600), END_S (15), MIN_S (60), DEVICE (cuda; cpu to try it here), KVBENCH_ARGS
# (more `kvbench run` options, e.g. "--limit 2"), RUN_ROOT (/tmp), MAX_FILE_K (4096: larger run
# files are not copied to OUT), and ci/device_env.sh's (PYTHON, WHEELS, GGUF_DIR, SITE, GRACE_S).
# Exit: 0 when every step that ran finished (a failed claim is a measurement: in its report) or
# stopped at its share, 1 when one failed (a test failed, a case crashed, a suite was refused, no
# model: summary.txt says which), 2 for a bad plan or option.
set -uo pipefail
cd "$(dirname "$0")/.."
source ci/device_env.sh
OUT=${OUT:-runs/gpu-session-out}
BUDGET_S=${BUDGET_S:-540}
END_S=${END_S:-15}
MIN_S=${MIN_S:-60}
DEVICE=${DEVICE:-cuda}
KVBENCH_ARGS=${KVBENCH_ARGS:-}
RUN_ROOT=${RUN_ROOT:-/tmp}
MAX_FILE_K=${MAX_FILE_K:-4096}
LOG_TAG=gpu_session
# Most valuable first: the kernels proven compiled and on GPU sizes (short), their speed against
# SDPA (short), the end-to-end cases never measured, and bfloat16 with what is left.
DEFAULT_PLAN="kernels        tests        tests/test_kernels.py      120  -
cuda           suite        suites/cuda.yaml            90  -
cuda-e2e       model-suite  suites/cuda-e2e.yaml       300  reports/cuda-e2e/results.jsonl
cuda-e2e-bf16  model-suite  suites/cuda-e2e-bf16.yaml    0  reports/cuda-e2e-bf16/results.jsonl"
PLAN=${PLAN:-$DEFAULT_PLAN}

mode=run
case "${1:-}" in
  "") ;;
  --dry-run) mode=dry ;;
  --check) mode=check ;;
  --pack) device_pack gguf; exit ;;
  *) echo "usage: ci/gpu_session.sh [--dry-run | --check | --pack]" >&2; exit 2 ;;
esac

NAMES=() KINDS=() TARGETS=() WEIGHTS=() SEEDS=()
while read -r name kind target weight seed _; do
  [ -z "${name:-}" ] || [ "${name:0:1}" = "#" ] && continue
  if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then continue; fi
  case "$kind" in tests|suite|model-suite) ;; *)
    echo "gpu_session: step $name: kind '$kind' is none of tests, suite, model-suite" >&2
    exit 2 ;;
  esac
  if ! [[ "${weight:-}" =~ ^[0-9]+$ ]] || [ ! -f "$target" ]; then
    echo "gpu_session: step $name: needs an existing target and a whole weight" \
         "(got '$target' '${weight:-}')" >&2
    exit 2
  fi
  NAMES+=("$name") KINDS+=("$kind") TARGETS+=("$target") WEIGHTS+=("$weight")
  SEEDS+=("${seed:--}")
done <<< "$PLAN"
[ ${#NAMES[@]} -gt 0 ] || { echo "gpu_session: no step in the plan (PLAN, STEPS)" >&2; exit 2; }

weights_from() {  # the sum of the weights of step $1 and those after it
  local i sum=0
  for ((i = $1; i < ${#NAMES[@]}; i++)); do sum=$((sum + WEIGHTS[i])); done
  echo $sum
}

usable_seed() {  # SEED: whether a run folder may start from it (it exists, run on DEVICE)
  [ "$1" != - ] && [ -f "$1" ] && [ "$($PYTHON -c 'import json, sys
print(json.loads(open(sys.argv[1]).readline())["header"]["settings"]["device"])' "$1" \
    2>/dev/null)" = "$DEVICE" ]
}

resumes_from() {  # STEP: the folder --resume would continue (the run folder, else the seed's)
  local dir=$RUN_ROOT/kvbench-${NAMES[$1]}
  if [ ! -f "$dir/results.jsonl" ] && usable_seed "${SEEDS[$1]}"; then dirname "${SEEDS[$1]}"
  else echo "$dir"; fi
}

suite_state() {  # TARGET DIR: what kvbench run --resume would keep and run, and the first to run
  local listing counts
  # shellcheck disable=SC2086
  listing=$(COLUMNS=400 $PYTHON -m kvbench.cli run "$1" --out "$2" --resume --dry-run \
    --device "$DEVICE" $KVBENCH_ARGS 2>&1) || { echo "(no listing: $(tail -1 <<<"$listing"))"
    return 0; }
  counts=$(grep -o '[0-9]* case(s)[^│]*' <<<"$listing" | head -1 | sed 's/ *$//')
  # the dry run's rows: | case | model | claims | kept or to run |
  awk -F'│' -v counts="$counts" '
    NF >= 5 && $(NF-1) ~ /to run/ { gsub(/ /, "", $2); if (n < 6) first = first " " $2; n++ }
    END { if (n) counts = counts ";" (n > 6 ? " first:" : "") first (n > 6 ? " ..." : "")
          print counts }
  ' <<<"$listing"
}

show_plan() {
  local total=$((BUDGET_S - END_S)) all i share
  all=$(weights_from 0)
  echo "gpu_session: plan: ${BUDGET_S}s in all (${END_S}s kept for the end), setup first, then" \
       "each step with its weight's share of the time then left (unused time passes on):"
  for ((i = 0; i < ${#NAMES[@]}; i++)); do
    if [ "${WEIGHTS[i]}" -gt 0 ]; then share="~$((total * WEIGHTS[i] / all))s"
    else share="what is left"; fi
    printf '  %d. %-14s %-12s %-28s %s%s\n' $((i + 1)) "${NAMES[i]}" "${KINDS[i]}" \
      "${TARGETS[i]}" "$share" "$([ "${SEEDS[i]}" != - ] && echo ", seed ${SEEDS[i]}$([ -f \
        "${SEEDS[i]}" ] || echo " (none yet)")")"
  done
}

if [ "$mode" = dry ]; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  show_plan
  for ((i = 0; i < ${#NAMES[@]}; i++)); do
    [ "${KINDS[i]}" = tests ] && continue
    from=$(resumes_from $i)
    echo "  ${NAMES[i]} (from $from): $(suite_state "${TARGETS[i]}" "$from")"
  done
  exit 0
fi

mkdir -p "$OUT"
LOG=$OUT/session.log
[ "$mode" = run ] && show_plan | tee -a "$LOG"
device_install || exit 1
device_env "$OUT/env.txt"
device_keep_gguf
if [ "$mode" = check ]; then
  cat "$OUT/env.txt"
  exit 0
fi

collect() {  # RUN_DIR DEST: the run's files (not previous runs, none over MAX_FILE_K) into DEST
  local dest big
  dest=$(mkdir -p "$2" && cd "$2" && pwd) || return 1
  (cd "$1" && find . -name previous -prune -o -type f ! -name '.*' -size -"${MAX_FILE_K}"k \
    -print0 | xargs -0 -r cp --parents -t "$dest")
  big=$(cd "$1" && find . -name previous -prune -o -type f -size +"$((MAX_FILE_K - 1))"k -print)
  [ -z "$big" ] || log "not copied (over ${MAX_FILE_K} KiB, left in $1): $big"
}

cases_in() { if [ -f "$1" ]; then grep -c '^{"type":"case"' "$1"; else echo 0; fi; }

MODEL=unknown
run_step() {  # STEP STOP_AT: sets RESULT (what happened) and CODE
  local i=$1 stop=$2 name=${NAMES[$1]} target=${TARGETS[$1]} out=$OUT/${NAMES[$1]}
  mkdir -p "$out"
  if [ "${KINDS[i]}" = tests ]; then
    local rc1 rc2=skipped
    # shellcheck disable=SC2086
    run_for $((stop - SECONDS)) $PYTHON -m pytest -q -p no:cacheprovider -rfE -m gpu \
      --junitxml="$out/gpu.xml" "$target" >"$out/gpu.log" 2>&1
    rc1=$?
    if [ $((stop - SECONDS)) -gt 5 ]; then
      run_for $((stop - SECONDS)) $PYTHON -m pytest -q -p no:cacheprovider -rfE \
        -m "not gpu and not slow" --junitxml="$out/tests.xml" "$target" >"$out/tests.log" 2>&1
      rc2=$?
    fi
    RESULT="-m gpu: $(tail -1 "$out/gpu.log") (exit $rc1); the rest: $([ "$rc2" = skipped ] \
      && echo "not started, no time left" || echo "$(tail -1 "$out/tests.log") (exit $rc2)")"
    CODE=done
    for rc in $rc1 $rc2; do  # pytest: 0 passed, 5 none selected
      case $rc in
        0|5) ;;
        124|137|skipped) [ $CODE = done ] && CODE=stopped ;;
        *) CODE=failed ;;
      esac
    done
    return
  fi
  if [ "${KINDS[i]}" = model-suite ]; then
    [ "$MODEL" = unknown ] && { device_model "$out/run.log" && MODEL=ready || MODEL=missing; }
    if [ "$MODEL" = missing ]; then
      RESULT="not run: no bundled model (carry the GGUF parts: docs/gpu-session.md)"
      CODE=failed
      return
    fi
  fi
  local dir=$RUN_ROOT/kvbench-$name before rc
  if [ ! -f "$dir/results.jsonl" ] && usable_seed "${SEEDS[i]}"; then
    mkdir -p "$dir" && cp "${SEEDS[i]}" "$dir/results.jsonl"
    log "$name: starts from ${SEEDS[i]} ($(cases_in "$dir/results.jsonl") cases)"
  elif [ ! -f "$dir/results.jsonl" ] && [ -f "${SEEDS[i]}" ]; then
    log "$name: ${SEEDS[i]} was not run on $DEVICE: not used, the suite starts over"
  fi
  before=$(cases_in "$dir/results.jsonl")
  # shellcheck disable=SC2086
  run_for $((stop - SECONDS)) $PYTHON -m kvbench.cli run "$target" --out "$dir" --resume \
    --device "$DEVICE" $KVBENCH_ARGS >>"$out/run.log" 2>&1
  rc=$?
  collect "$dir" "$out"
  RESULT="$(($(cases_in "$dir/results.jsonl") - before)) case(s) run now (exit $rc); "
  if [ "$rc" -le 1 ] && [ -z "$KVBENCH_ARGS" ]; then  # it ran to its end: none left
    RESULT+="all $(cases_in "$dir/results.jsonl") finished"
  else
    RESULT+="now $(suite_state "$target" "$dir")"
  fi
  case $rc in  # kvbench run's exit codes (kvbench --help)
    0) CODE=done ;;
    1) CODE=done RESULT+="; a claim failed or a regression (report.md)" ;;
    124|137) CODE=stopped ;;
    3) CODE=failed RESULT+="; a case crashed (results.json: its error)" ;;
    *) CODE=failed RESULT+="; $(grep -v '^[[:space:]]*$' "$out/run.log" | tail -1)" ;;
  esac
}

end=$((BUDGET_S - END_S))
SUMMARY=() worst=0
for ((i = 0; i < ${#NAMES[@]}; i++)); do
  left=$((end - SECONDS)) rest=$(weights_from $i)
  if [ "$rest" -gt 0 ]; then share=$((left * WEIGHTS[i] / rest)); else share=$left; fi
  if [ "$share" -lt "$MIN_S" ]; then
    line="${NAMES[i]}: left, not started (${share}s of ${left}s left for it, under MIN_S)"
    [ "${KINDS[i]}" = tests ] || line+=": $(suite_state "${TARGETS[i]}" "$(resumes_from "$i")")"
    SUMMARY+=("$line")
    log "${SUMMARY[-1]}"
    continue
  fi
  started=$SECONDS
  log "${NAMES[i]}: ${share}s of the ${left}s left (stopped after $((share - GRACE_S))s)"
  run_step "$i" $((started + share - GRACE_S))
  [ "$CODE" = failed ] && worst=1
  SUMMARY+=("${NAMES[i]}: $CODE after $((SECONDS - started))s of ${share}s: $RESULT")
  log "${SUMMARY[-1]}"
done

{
  echo "gpu_session: ${SECONDS}s of ${BUDGET_S}s; what ran and what was left:"
  printf '  %s\n' "${SUMMARY[@]}"
  echo "  back in $OUT: $(du -sh "$OUT" | cut -f1)"
} | tee "$OUT/summary.txt" | tee -a "$LOG"
exit $worst
