#!/usr/bin/env bash
# One device call (issue 12): a bf16 prefill package of one LLM workload verified on the GPU,
# then `kforge tune --check` (the finer-scheme rung first, strict after), then both states timed
# (benchmarks/llm/time_package.py), then `kforge bench` on the checked package: eager, the two
# torch.compile modes on the bf16 model and on the fp32 model, and KForge, in the same run.
# BENCH=0 (a shape whose bench does not fit the call): step 4 is left out, and step 3 also
# times the bf16 model under both torch.compile modes.
#
#   PACKAGES=.carry/l2 WORKLOAD=benchmarks/models/llama3_8b.py::prefill \
#     KFORGE_LLM_LAYERS=2 KFORGE_LLM_BATCH=4 KFORGE_LLM_SEQ=1024 bash benchmarks/llm/check_prefill_h200.sh
#
# The package is built here first (benchmarks/build_packages.sh, the same KFORGE_LLM_* shape).
# Writes under $OUT: env.txt, tune.log, fit.log, time.log, bench.{json,md}, bench.log,
# kernels.txt, tuned.tgz (the checked package, weights stripped), profile.{log,json} (PROFILE=1),
# the rest in rest.tgz (BENCH=1 and PROFILE=1 together keep 9 files: one more than comes back).
set -uo pipefail
DEFAULT_PACKAGES=.carry/l2
source "$(dirname "$0")/../device_env.sh"
WORKLOAD="${WORKLOAD:-benchmarks/models/llama3_8b.py::prefill}"
FILE="${WORKLOAD%%::*}"
PHASE="${WORKLOAD##*::}"
export KFORGE_ZOO_SIZE="${KFORGE_ZOO_SIZE:-real}"
BUDGET_S="${BUDGET_S:-570}"
carried_wheels
env_txt
env | grep '^KFORGE_' | sort | tee -a "$OUT/env.txt"
P="$(ls -d "$PACKAGES"/bf16/*."$PHASE" | head -1)"

# 1. every region's candidates verified on the GPU (no tuning rounds), 4 worker processes
$PY -m kforge.bench.packages --tune --out "$PACKAGES" --jobs 1 --gpus 1 --workers local:4 \
  --rounds 0 --timeout 300 --deadline "$(( START + ${TUNE_DEADLINE_S:-200} ))" \
  --precision bf16 "$FILE" > "$OUT/tune.log" 2>&1
tail -8 "$OUT/tune.log"
rm -rf /tmp/before && cp -r "$P" /tmp/before

# 2. the whole model against eager fp32; the worst region one rung finer, then strict
$PY -m kforge.cli tune "$P" --check --check-limit "${CHECK_LIMIT:-4}" > "$OUT/fit.log" 2>&1
tail -25 "$OUT/fit.log"

# 3. what the check cost: both states timed alike
# BENCH=0: no bench; the bf16 model's two torch.compile modes are timed here instead
BENCH="${BENCH:-1}"
COMPILED=""
[ "$BENCH" = 0 ] && COMPILED=--compiled
# (EXTRA_PACKAGES: other packages of the same workload timed in the same process, after)
$PY benchmarks/llm/time_package.py $COMPILED /tmp/before "$P" ${EXTRA_PACKAGES:-} \
  > "$OUT/time.log" 2>&1
cat "$OUT/time.log"
$PY benchmarks/llm/package_kernels.py "$P" > "$OUT/kernels.txt" 2>&1
tar czf "$OUT/tuned.tgz" --exclude='*.safetensors' "$P"

# 3b. PROFILE=1: the checked package kernel by kernel (and the bf16 model under torch.compile
# where the time left allows), benchmarks/llm/profile_package.py
if [ "${PROFILE:-0}" = 1 ]; then
  L=$(( START + BUDGET_S - 15 - $(date +%s) ))
  PARGS=""
  [ "$L" -lt 170 ] && PARGS=--no-compiled
  [ "$L" -gt 50 ] && timeout "$L" $PY benchmarks/llm/profile_package.py "$P" $PARGS \
    --json "$OUT/profile.json" > "$OUT/profile.log" 2>&1
  head -45 "$OUT/profile.log"
fi

# 4. the checked package against the routes a user would take, in one run
[ "$BENCH" = 0 ] || $PY -m kforge.cli bench "$WORKLOAD" --target cuda --precision bf16 --packages "$PACKAGES" \
  --no-tune --out "$OUT" --checkpoint "$OUT/partial.json" --min-reps "${MIN_REPS:-5}" \
  --rep-ms "${REP_MS:-50}" --deadline "$(( START + BUDGET_S - 20 ))" 2>&1 \
  | tee "$OUT/bench.log" | tail -30
pack_out bench.json bench.md fit.log time.log kernels.txt tuned.tgz env.txt profile.log profile.json
