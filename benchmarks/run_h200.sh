#!/usr/bin/env bash
# The H200 benchmark run, for the device machine (torch + triton only: no MLIR, no torch-mlir).
# Runs in the repository root there. For the packages built here by benchmarks/build_packages.sh
# (carried as .carry/bench), it verifies and tunes each on the GPU (`kforge tune`), then times
# PyTorch eager, torch.compile and KForge on every workload, one process per GPU, and writes
# into $OUT: bench.json, bench.md, bench.png (merged over the GPUs), run.log, env.txt.
#
# Environment (all optional):
#   PACKAGES   package folder (default .carry/bench; missing -> KForge recorded as skipped)
#   PRECISION  policies, comma-separated (default strict,tf32,bf16)
#   WORKLOADS  space-separated names/globs (default: the whole suite)
#   SHARDS     split the suite into this many shards (default: number of GPUs)
#   SHARD_IDS  which shards this call runs (default: all); with SHARDS > GPUs, run the rest in
#              later calls and merge here: kforge bench --merge a/bench.json b/bench.json --out DIR
#   BUDGET_S   seconds after which no new workload starts (default 500: inside a 600 s call)
#   BASELINES  eager,compile (default); EXTRA: more `kforge bench` arguments
#   TARGET     cuda (default); `TARGET=cpu EXTRA=--smoke` dry-runs this script on a CPU machine
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/out/bench}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/kforge-inductor}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/kforge-triton}"
# Several GPUs of one host: keep NVLink multicast off (KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PACKAGES="${PACKAGES:-.carry/bench}"
PRECISION="${PRECISION:-strict,tf32,bf16}"
BUDGET_S="${BUDGET_S:-500}"
BASELINES="${BASELINES:-eager,compile}"
TARGET="${TARGET:-cuda}"
DEADLINE=$(( $(date +%s) + BUDGET_S ))
WORK="$(mktemp -d /tmp/kforge-bench.XXXX)"

{
  date -u +%Y-%m-%dT%H:%M:%SZ; uname -a; nvidia-smi || true
  "$PY" -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  echo "packages: $PACKAGES ($(du -sh "$PACKAGES" 2>/dev/null | cut -f1 || echo missing))"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [ "$TARGET" = cpu ]; then NGPU=1; else
  NGPU="$("$PY" -c 'import torch; print(torch.cuda.device_count())')"
  if [ "${NGPU:-0}" -lt 1 ]; then echo "no CUDA device visible" | tee "$OUT/run.log"; exit 1; fi
fi
SHARDS="${SHARDS:-$NGPU}"
SHARD_IDS="${SHARD_IDS:-$(seq -s ' ' 0 $((SHARDS - 1)))}"
PKG_ARGS=()
if [ -d "$PACKAGES" ]; then PKG_ARGS=(--packages "$PACKAGES"); else
  echo "no package folder $PACKAGES: KForge will be recorded as skipped" | tee -a "$OUT/env.txt"
  PKG_ARGS=(--packages "$WORK/no-packages")
fi

# Shard ids go round-robin to the GPUs; each GPU runs its shards one after the other.
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
        --shard "$s/$SHARDS" --deadline "$DEADLINE" --out "$WORK/shard$s" ${EXTRA:-} \
        > "$WORK/shard$s.log" 2>&1
      echo "shard $s on GPU $g exited $?" >> "$WORK/shard$s.log"
    done
  ) &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done

for f in "$WORK"/shard*.log; do echo "===== $(basename "$f")"; cat "$f"; done > "$OUT/run.log"
shopt -s nullglob
jsons=("$WORK"/shard*/bench.json)
if [ ${#jsons[@]} -eq 0 ]; then echo "no shard produced bench.json; see run.log"; tail -50 "$OUT/run.log"; exit 1; fi
"$PY" -m kforge.cli bench --merge "${jsons[@]}" --out "$OUT" >> "$OUT/run.log" 2>&1 || tail -30 "$OUT/run.log"
# The end of the output is what the device tool returns: the summary table.
sed -n '/^## Summary/,/^## Per workload/p' "$OUT/bench.md"
grep -E "exited|Traceback|Error" "$OUT/run.log" | tail -20
ls -la "$OUT"
