#!/usr/bin/env bash
# One device call: the builtin's persistent TMA GEMM as it is now (the epilogue in column
# slices, 4 or 6 stages, the tile loop flattened: kernels.tma_configs) against the tiles it had
# before (whole-tile epilogue, 3 stages at 128x256 / 4 at 128x128, only the K loop pipelined) and
# against cuBLAS, in one process per policy, each variant timed KF_PASSES times in alternating
# order; then the split-K rule (`_starved_by_tma`) at the shape that motivated it, and strict's
# opt-in fp16x3 TMA tiles (the first in two column parts) against its pointer kernel. Writes
# env.txt and, per step, a log and builtin_gemm.json under $OUT/<step>/.
#
#   OUT=$OUT bash benchmarks/gemm/ab_tma_h200.sh          (on the device, repository root)
set -uo pipefail
source "$(dirname "$0")/../device_env.sh"
env_txt
step() {        # step NAME TIMEOUT_S ENV...: bench_builtin.py with the given environment
  local name=$1 limit=$2; shift 2
  mkdir -p "$OUT/$name"
  env "$@" OUT="$OUT/$name" KF_PASSES="${KF_PASSES:-2}" timeout "$limit" \
    $PY benchmarks/gemm/bench_builtin.py > "$OUT/$name/log.txt" 2>&1
  grep -E "x[0-9]+x[0-9]+ |^\|" "$OUT/$name/log.txt"
}
# beyond 512 rows: first configuration (new), v0 the old one, v1 the new one not flattened
step big "${BIG_S:-300}" KF_POLICY=bf16 KF_SCHEMES=fp16x1 KF_BUDGET_S=260 \
  KF_TMA_VARIANTS='[{"EPI_SPLIT": 1, "FLATTEN": false, "num_stages": 3}, {"FLATTEN": false}]' \
  KF_SHAPES="${BIG_SHAPES:-8192,8192,8192;4096,4096,4096;2048,2048,8192;8192,4096,1024;\
16384,4096,14336}"
# up to 512 rows: v0 the old first tile (4 stages, whole epilogue, not flattened)
step small "${SMALL_S:-120}" KF_POLICY=bf16 KF_SCHEMES=fp16x1 KF_BUDGET_S=100 \
  KF_TMA_VARIANTS='[{"EPI_SPLIT": 1, "FLATTEN": false, "num_stages": 4}, {"FLATTEN": false}]' \
  KF_SHAPES="${SMALL_SHAPES:-512,4096,8192;256,8192,8192}"
# the split-K rule: the pointer kernel's split-K tiles against the TMA tiles it replaces
step splitk "${SPLITK_S:-100}" KF_POLICY=tf32 KF_SCHEMES=fp16x1 KFORGE_BUILTIN_TMA=1 \
  KF_BUDGET_S=80 KF_SHAPES="256,1024,32768;512,1024,16384"
# strict: fp16x3 on the TMA kernel (opt-in; its first tile in two column parts, N_PARTS, then
# 128x128x64) against the pointer kernel and PyTorch's fp32
step strict "${STRICT_S:-130}" KF_POLICY=strict KF_BUDGET_S=110 \
  KF_SHAPES="4096,4096,4096;8192,8192,8192"
echo "wall $(( $(date +%s) - START )) s"
pack_out big/builtin_gemm.json small/builtin_gemm.json splitk/builtin_gemm.json \
  strict/builtin_gemm.json run.log env.txt
