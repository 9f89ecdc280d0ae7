#!/usr/bin/env bash
# The H200 benchmark run, for the device machine (torch + triton only: no MLIR, no torch-mlir).
# Runs from the repository root there, on packages built here by benchmarks/build_packages.sh
# and carried as .carry/bench:
#   1. in parallel: verify (and with TUNE_ROUNDS > 0 tune) the candidate kernels of this call's
#      packages on the GPU, TUNE_JOBS at a time (python -m kforge.bench.packages --tune), and
#      torch.compile every workload, COMPILE_JOBS at a time, to warm Inductor's caches and
#      record cold compile times (python -m kforge.bench.precompile; SKIP_PRECOMPILE=1 skips);
#   2. time PyTorch eager, torch.compile and KForge on each workload, one process per GPU
#      (kforge bench --shard), checking KForge on fresh inputs;
#   3. merge the shards.
# Writes into $OUT: bench.json, bench.md, bench.png, run.log, env.txt, and tuned.tar.gz (the
# packages' manifests and kernels after tuning; unpack into .carry/bench here to reuse them).
#
# Environment (all optional):
#   PACKAGES     package folder (default .carry/bench; missing -> KForge recorded as skipped, but
#                a folder named here that is missing stops the run before it spends device time:
#                it was not carried; NO_PACKAGES_OK=1 runs the baselines anyway)
#   PRECISION    policies, comma-separated (default strict,tf32,bf16)
#   WORKLOADS    space-separated names/globs (default: the whole suite)
#   SHARDS       cut the suite into this many shards (default: the number of GPUs)
#   SHARD_IDS    the shards this call runs (default: all). With SHARDS > GPUs, run the rest in
#                later calls and merge here: kforge bench --merge a/bench.json b/bench.json --out DIR
#   BUDGET_S     no new workload starts after this many seconds from the start (default 520)
#   TUNE_JOBS    packages verified at a time (default 8 per GPU); TUNE_ROUNDS (default 0): optimization
#                rounds per region (>0 times configurations: then TUNE_JOBS = number of GPUs);
#                TUNE_TIMEOUT per package (default 180 s); SKIP_TUNE=1 skips the tuning
#   PREP_S       no tuning or precompile job starts after this many seconds (default 200); what
#                is left is done by the timed run itself (tuning) or measured there (compile)
#   COMPILE_JOBS torch.compile pre-pass processes (default 8); with matched baselines the pre-pass
#                also warms the policies' compiled routes (bf16 model default and max-autotune,
#                tf32), keeping none of their autotuning choices (kforge.bench.precompile --routes);
#                PRECOMPILE_TIMEOUT per workload (default 240 s)
#   BASELINES    eager,compile (default); BASELINE_PRECISION matched (default: the PyTorch route at each policy's precision, docs/bench.md) | as-written
#   EXTRA        more `kforge bench` arguments
#   TARGET       cuda (default); `TARGET=cpu EXTRA=--smoke` dry-runs this script without a GPU
#   KFORGE_SOURCE_COMMIT  the commit of the tree sent (the device copy's git metadata can be
#                stale): KFORGE_SOURCE_COMMIT=$(git rev-parse --short HEAD) typed in here
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
PRECISION="${PRECISION:-strict,tf32,bf16}"
BUDGET_S="${BUDGET_S:-520}"
BASELINES="${BASELINES:-eager,compile}"
TARGET="${TARGET:-cuda}"
DEADLINE=$((START + BUDGET_S))
PREP_DEADLINE=$((START + ${PREP_S:-200}))
WORK="$(mktemp -d /tmp/kforge-bench.XXXX)"
# Logs and per-workload checkpoints go straight under $OUT, so a call cut off by its time limit
# still brings back what was measured (merge them here: kforge bench --merge $OUT/partial/*.json).
LOGS="$OUT/logs"; mkdir -p "$LOGS" "$OUT/partial"

{
  date -u +%Y-%m-%dT%H:%M:%SZ; uname -a; nvidia-smi 2>&1 || true
  "$PY" -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  echo "packages: $PACKAGES ($(du -sh "$PACKAGES" 2>/dev/null | cut -f1 || echo missing))"
} > "$OUT/env.txt" 2>&1
tail -3 "$OUT/env.txt"

if [ "$TARGET" = cpu ]; then NGPU=1; else
  NGPU="$("$PY" -c 'import torch; print(torch.cuda.device_count())')"
  if [ "${NGPU:-0}" -lt 1 ]; then echo "no CUDA device visible" | tee "$OUT/run.log"; exit 1; fi
fi
SHARDS="${SHARDS:-$NGPU}"
SHARD_IDS="${SHARD_IDS:-$(seq -s ' ' 0 $((SHARDS - 1)))}"
SHARD_ARGS=(); for s in $SHARD_IDS; do SHARD_ARGS+=(--shard "$s/$SHARDS"); done

# 1. In parallel, on the CPU cores while the GPU is mostly idle: verify (and tune) this call's
#    packages, TUNE_JOBS at a time, and warm Inductor's caches with a torch.compile of every
#    workload, COMPILE_JOBS at a time, recording the cold compile times.
PKG_ARGS=(--packages "$PACKAGES")
prep=()
if [ ! -d "$PACKAGES" ] && [ -n "$PACKAGES_GIVEN" ] && [ "${NO_PACKAGES_OK:-0}" != 1 ]; then
  echo "error: PACKAGES=$PACKAGES is not here (was it built and carried? an ignored folder travels only when carry names it, and a fresh checkout has none); stopping before the timed run (NO_PACKAGES_OK=1 times the baselines alone)" | tee -a "$OUT/env.txt" "$OUT/run.log" >&2
  exit 2
fi
if [ ! -d "$PACKAGES" ]; then
  echo "no package folder $PACKAGES: KForge will be recorded as skipped" | tee -a "$OUT/env.txt"
  PKG_ARGS=(--packages "$WORK/no-packages")
elif [ "${SKIP_TUNE:-0}" != 1 ] && [ "$TARGET" = cuda ]; then
  ROUNDS="${TUNE_ROUNDS:-0}"
  JOBS="${TUNE_JOBS:-$([ "$ROUNDS" -gt 0 ] && echo "$NGPU" || echo $((8 * NGPU)))}"
  (
    # shellcheck disable=SC2086
    "$PY" -m kforge.bench.packages --tune --out "$PACKAGES" --precision "$PRECISION" ${WORKLOADS:-} \
      "${SHARD_ARGS[@]}" --jobs "$JOBS" --gpus "$NGPU" --rounds "$ROUNDS" \
      --timeout "${TUNE_TIMEOUT:-180}" --deadline "$PREP_DEADLINE" > "$LOGS/tune.log" 2>&1
    echo "tune phase: exit $?, $(($(date +%s) - START)) s since start" >> "$LOGS/tune.log"
  ) &
  prep+=($!)
fi
COMPILE_ARGS=()
if [[ "$BASELINES" == *compile* ]] && [ "${SKIP_PRECOMPILE:-0}" != 1 ]; then
  (
    # shellcheck disable=SC2086
    "$PY" -m kforge.bench.precompile --out "$WORK/compile-times" ${WORKLOADS:-} "${SHARD_ARGS[@]}" \
      --jobs "${COMPILE_JOBS:-8}" --timeout "${PRECOMPILE_TIMEOUT:-240}" --deadline "$PREP_DEADLINE" \
      $([ "${BASELINE_PRECISION:-matched}" = matched ] && echo --routes "$PRECISION") \
      $([ "$TARGET" = cpu ] && echo --smoke) > "$LOGS/precompile.log" 2>&1
    echo "precompile phase: exit $?, $(($(date +%s) - START)) s since start" >> "$LOGS/precompile.log"
  ) &
  prep+=($!)
  COMPILE_ARGS=(--compile-times "$WORK/compile-times")
fi
for p in "${prep[@]}"; do wait "$p"; done
tail -qn1 "$LOGS/tune.log" "$LOGS/precompile.log" 2>/dev/null

# 2. Time. Shard ids go round-robin to the GPUs; each GPU runs its shards one after another.
pids=()
for ((g = 0; g < NGPU; g++)); do
  mine=(); i=0
  for s in $SHARD_IDS; do [ $((i % NGPU)) -eq "$g" ] && mine+=("$s"); i=$((i + 1)); done
  [ ${#mine[@]} -eq 0 ] && continue
  (
    for s in "${mine[@]}"; do
      # shellcheck disable=SC2086
      CUDA_VISIBLE_DEVICES=$g "$PY" -m kforge.cli bench ${WORKLOADS:-} --target "$TARGET" \
        --precision "$PRECISION" "${PKG_ARGS[@]}" --baselines "$BASELINES" \
        --baseline-precision "${BASELINE_PRECISION:-matched}" \
        --shard "$s/$SHARDS" --deadline "$DEADLINE" --out "$WORK/shard$s" --checkpoint "$OUT/partial/shard$s.json" \
        "${COMPILE_ARGS[@]}" ${EXTRA:-} \
        > "$LOGS/shard$s.log" 2>&1
      echo "shard $s on GPU $g exited $?" >> "$LOGS/shard$s.log"
    done
  ) &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done

# 3. Merge, and bring back what the next call or the commit needs.
for f in "$LOGS"/tune.log "$LOGS"/precompile.log "$LOGS"/shard*.log; do [ -f "$f" ] && { echo "===== $(basename "$f")"; cat "$f"; }; done > "$OUT/run.log"
shopt -s nullglob
jsons=()
for s in $SHARD_IDS; do   # a shard that did not finish contributes its checkpoint
  if [ -f "$WORK/shard$s/bench.json" ]; then jsons+=("$WORK/shard$s/bench.json")
  elif [ -f "$OUT/partial/shard$s.json" ]; then jsons+=("$OUT/partial/shard$s.json"); fi
done
if [ ${#jsons[@]} -eq 0 ]; then echo "no shard produced bench.json; see run.log"; tail -50 "$OUT/run.log"; exit 1; fi
"$PY" -m kforge.cli bench --merge "${jsons[@]}" --out "$OUT" >> "$OUT/run.log" 2>&1 || tail -30 "$OUT/run.log"
if [ -d "$PACKAGES" ]; then
  tar czf "$OUT/tuned.tar.gz" -C "$PACKAGES" --exclude='*.safetensors' --exclude='__pycache__' . 2>/dev/null
  [ "$(stat -c %s "$OUT/tuned.tar.gz")" -gt 16000000 ] && rm -f "$OUT/tuned.tar.gz"
fi
# The end of the output is what the device tool returns: the summary table and any failures.
sed -n '/^## Summary/,/^fast_p/p' "$OUT/bench.md"
grep -E "exited|Traceback|Error|tune phase|precompile phase" "$OUT/run.log" | tail -20
echo "total $(($(date +%s) - START)) s"; ls -la "$OUT"
