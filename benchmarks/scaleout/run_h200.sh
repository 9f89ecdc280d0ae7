#!/usr/bin/env bash
# Issue 16 on the H200 (one GPU): several Ray region tasks sharing the GPU for verification, with
# memory admission, against one task holding it alone; the wall time of verifying zoo packages.
#
# Packages are built here first (MLIR, torch-mlir), at the zoo's small size:
#   KFORGE_ZOO_SIZE=small PRECISION=strict OUT=.carry/zoo benchmarks/build_packages.sh \
#       benchmarks/models/{bert,gpt2,llama}.py
# Ray is not in the device image, and its wheel (79 MB) is over a device call's 64 MiB: carry a
# trimmed one (`bash scripts/ray_wheel_for_device.sh`: no Java jars, no RLlib, no dashboard UI) with the
# four small wheels its jsonschema needs, in .carry/ray.
#
# Each setting starts from the same packages, an empty kernel cache and an empty Triton cache,
# in a fresh `ray start --head` cluster (16 CPUs, 1 GPU), and runs
#   python -m kforge.bench.packages --tune --jobs 3 --workers ray:auto --gpu-share K
# Settings (SETTINGS picks a subset):
#   share1        --gpu-share 1: one region task on the GPU at a time (the GPU held alone)
#   share4        --gpu-share 4: up to four region tasks on the GPU, admitted by free memory
#   share8-admit  --gpu-share 8 with KFORGE_TASK_CONTEXT_MB=40000: Ray would place eight, but each
#                 task asks for 40 GB, so memory admission lets about three run at once
# Sampled every 0.25 s: GPU memory used and utilization (nvidia-smi), and the reservations the
# admission holds (tasks admitted at once). Writes $OUT/scaleout.json and the logs.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../device_env.sh"
PACKAGES="${ZOO_PACKAGES:-.carry/zoo}"
MODELS="${MODELS:-benchmarks/models/bert.py benchmarks/models/gpt2.py benchmarks/models/llama.py}"
SETTINGS="${SETTINGS:-share4 share8-admit share1}"
SETTING_S="${SETTING_S:-150}"
if ls .carry/ray/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .carry/ray/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
RAY=("$PY" -c 'import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; sys.exit(main())')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/scaleout-env.txt"
$PY -c 'import ray, torch, triton; print("ray", ray.__version__, "torch", torch.__version__, "triton", triton.__version__)' \
  | tee -a "$OUT/scaleout-env.txt"

run_setting() {
  local name=$1 share=$2 context_mb=${3:-}
  local dir=/tmp/so/$name
  rm -rf "$dir"; mkdir -p "$dir"; cp -r "$PACKAGES" "$dir/pkgs"
  (
    export TRITON_CACHE_DIR=$dir/triton KFORGE_CACHE=$dir/kcache KFORGE_DEVICE_LOCKS=$dir/locks
    [ -n "$context_mb" ] && export KFORGE_TASK_CONTEXT_MB=$context_mb
    "${RAY[@]}" start --head --num-cpus 16 --num-gpus 1 --include-dashboard=false \
      --disable-usage-stats > "$OUT/$name.ray-start.log" 2>&1 || { tail "$OUT/$name.ray-start.log"; exit 1; }
    nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader,nounits \
      -lms 250 > "$OUT/$name.smi.csv" &
    local smi=$!
    ( while :; do
        echo "$(date +%s.%N) $(ls "$dir"/locks/cuda-*/*.reservation 2>/dev/null | wc -l)"; sleep 0.25
      done ) > "$OUT/$name.admitted.txt" &
    local adm=$!
    local t0; t0=$(date +%s.%N)
    timeout "$SETTING_S" $PY -m kforge.bench.packages --tune --out "$dir/pkgs" --jobs 3 \
      --workers ray:auto --gpu-share "$share" --timeout "$SETTING_S" --precision strict $MODELS \
      > "$OUT/$name.tune.log" 2>&1
    local rc=$?
    local t1; t1=$(date +%s.%N)
    kill $smi $adm 2>/dev/null
    "${RAY[@]}" stop --force > /dev/null 2>&1
    echo "$name rc=$rc wall_s=$(python3 -c "print(round($t1-$t0, 1))")" | tee -a "$OUT/scaleout-walls.txt"
    tail -4 "$OUT/$name.tune.log"
    mkdir -p "$OUT/$name.records"
    cp "$dir"/pkgs/strict/*.tune.json "$OUT/$name.records/" 2>/dev/null
    # the manifests hold each region's status as it was verified (also when the setting was cut)
    for m in "$dir"/pkgs/strict/*/manifest.json; do
      cp "$m" "$OUT/$name.records/$(basename "$(dirname "$m")").manifest.json"
    done
  )
}
for s in $SETTINGS; do
  case $s in
    share1) run_setting share1 1 ;;
    share4) run_setting share4 4 ;;
    share8-admit) run_setting share8-admit 8 40000 ;;
    *) echo "unknown setting $s" ;;
  esac
done
$PY benchmarks/scaleout/summarize.py "$OUT" $SETTINGS | tee "$OUT/scaleout.md"
# a device call returns few files: the logs and samples travel as one archive
(cd "$OUT" && tar czf scaleout-logs.tgz --remove-files share*) 2>/dev/null
